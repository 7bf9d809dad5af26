"""What training reports while it runs, for workers and drivers alike: progress beats, the clock, the metrics
history, W&B runs and the code's provenance."""
