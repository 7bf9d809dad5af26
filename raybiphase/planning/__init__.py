"""What a sweep will run and what it costs, before anything runs: the planner (a grid of runs -> a tree of exactly
shared segments and the checkpoints fine-tuned), the cost model (GPU-hours, the bill, the timeline, disk space),
the dry run's lines (power, staging, replicates) and the preflight checks. Pure: no Ray, no torch, so the dry run
and `raybiphase validate` answer in about a second; the runtime that carries a plan out is raybiphase.sweep."""
