"""The one user-error type of `launch/`: raised anywhere below the CLI, printed by it without a traceback.

It lives here, not in `launch.cli`, so that the trainer, fine-tuning and export can raise it without
depending on the CLI layer.
"""


class CliError(Exception):
    """A user error: printed as `bertpipe <cmd>: error: <message>` with exit code 2, no traceback.

    The message says what to change.
    """
