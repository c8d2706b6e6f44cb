"""Where and how a step's function runs: in a thread, through a fray client, as an iris job.

Promise: the function sees the same context (output path, dependencies, stop signals) wherever it
runs, and everything around the call (lease, status, artifact) is done the same way on every
backend, so the files a step leaves do not depend on where it ran.
"""
