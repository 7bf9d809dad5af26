"""Running a sweep: the driver, its one scheduler of segments and fine-tuning trials, the lease, the by-size gate and
the repair of its tables (what it carries out, planned before anything runs: raybiphase.planning)."""
