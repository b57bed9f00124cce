"""What crosses the process boundary in part scaling: the events its in-process code adds to a
trace (its functions' calls are the core's CallsTask, protocol.py)."""
from __future__ import annotations

# The events this part's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    # with DDP_LAB_TRACE_STEPS=1, after each optimizer step: its number (1, 2, ...), each parameter
    # group's learning rate, and the images the DDP model was given in training mode since the last
    "step": ("n", "lrs", "images"),
}
