"""The Pulumi program of infra/Pulumi.yaml: the current stack's settings file, declared (infra.stack)."""

from pathlib import Path

from infra.stack import run_program

run_program(Path(__file__).resolve().parent.parent)
