"""A run's configuration: one typed tree, loaded from a preset plus overrides.

  schema    the typed tree: every field with its default, its source and one line of help
  monitors  the `monitors` section: replay-health bounds and their actions
  base      what every section shares; ConfigError
  load      YAML presets (`configs/`) + `--set dotted.key=value` overrides, errors that name the key
  keys      `exgrpo config --help-keys`: every key's type, default and help
"""
