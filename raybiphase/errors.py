"""The two kinds of bad input, at the bottom of the import order so every layer can raise them; the commands turn
either into one line on stderr and exit code 2 (raybiphase.commands.run_main)."""


class UserError(RuntimeError):
    """Bad input the user can fix: a missing shard, an unreachable bucket, an unknown task."""


class ConfigError(ValueError):
    """A configuration problem, reported as one line that names the dotted key."""
