"""Fine-tuning: tasks and their data, scoring, one head per family, one trial, the Ray Tune fan-out with ASHA."""
