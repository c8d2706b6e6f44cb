"""What a step and a run leave behind: the files in each step folder, a run's report, a failure's message.

Promise: everything a later process needs to know about a step (what ran, its status and owner,
where its result is) is read from its folder, in plain JSON a person can read too; the run's
report and a failed step's message say what happened in one place. Reading records never runs or
changes a step.
"""
