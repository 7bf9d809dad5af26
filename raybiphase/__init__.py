"""raybiphase: pretrain text encoders with CLM then MLM on Ray, sweep the splits, fine-tune, report."""

__version__ = "0.1.0"
