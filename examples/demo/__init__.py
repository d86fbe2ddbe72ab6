"""``flywheel demo``: warm start (``warmstart``), runs through the embedded stack (``run``, ``pipeline``),
live display (``live``) and the report with its plot (``report``)."""
