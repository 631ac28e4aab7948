"""`dspark-obs`: argument parsing and printing; every command's work is a library call."""
