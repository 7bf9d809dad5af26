"""Pretraining: EuroBERT sizes and model, FSDP2, the phase schedule, the loop every Ray Train worker runs, checkpoints, the trainer."""
