"""The results files: the cell record and its validation, results I/O, and the nightly history store."""
