"""`python -m launch.cli <command> ...`, and the script `ray submit` copies to a Ray head
(`ray submit deploy/ray-cluster.yaml launch/cli/__main__.py sweep ...`)."""

import sys

from launch.cli import main

sys.exit(main())
