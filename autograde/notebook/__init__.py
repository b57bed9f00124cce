"""What the notebooks call besides the checks: the machine and the data (`lab`), launches that
fail loudly, and the pictures (`plots`)."""
