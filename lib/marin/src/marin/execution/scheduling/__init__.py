"""When each step is attempted: started as its dependencies finish, one attempt at a time under its lease.

Promise: a step starts only after all its dependencies succeeded, at most ``max_concurrent`` at
once; each attempt takes the lease, writes its status, runs, and commits in that order, so two
runners on one prefix never run a step twice, and a failure marks its dependents without running them.
"""
