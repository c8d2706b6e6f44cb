"""What a run will do: the graph of its steps, their output folders, which are done, and its options.

Promise: a plan is decided before anything runs and writes nothing: cycles, two steps with one
identity, a folder holding another identity's output and an unusable prefix are refused by name;
a finished output is reused only when its recorded identity matches.
"""
