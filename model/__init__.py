"""BERT as plain nn.Modules: encoder, pre-training and fine-tuning heads, HF checkpoint adapter.

Nothing in this package imports torch.distributed, deepspeed, ray, apache_beam or argparse
(tests/test_model_imports.py keeps it so): parallelism and launching are applied from outside.
"""
