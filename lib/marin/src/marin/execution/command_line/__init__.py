"""What a person types: the engine's ``marin`` subcommands (run, status, explain, reproduce, logs).

Promise: each command is a thin front on the parts below; a mistake a user can make is reported in
one line with what to do, and the exit status says what happened.
"""
