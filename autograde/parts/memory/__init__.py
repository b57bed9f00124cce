"""Part memory (notebooks 30-): where a rank's memory goes and how to win it back. See autograde/parts/__init__.py for what each file holds."""
