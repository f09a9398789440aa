"""treenic: hardware/software co-design toolkit for gradient all-reduce."""
__version__ = "0.1.0"
