"""What results look like to a reader, shared by eval, compare, reproduce and the benchmarks:
markdown tables (`tables.py`), PNG plots (`plots.py`) and paired intervals (`significance.py`)."""
