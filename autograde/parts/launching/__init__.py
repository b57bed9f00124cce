"""Part launching: see autograde/parts/__init__.py for what each file holds."""
