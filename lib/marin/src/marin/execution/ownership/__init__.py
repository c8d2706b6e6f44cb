"""Who owns a step's folder now, and how what no longer owns it is made to stop.

Promise: one execution at a time may write a step's output; it writes into its own staging folder
and commits only while its fencing token still holds, so a stale execution can neither commit nor
mix its bytes with another's. Ctrl-C, SIGTERM and a lost fence stop running steps within a bound,
and only state a step declared resumable is carried into the next execution.
"""
