"""Model cards: a Markdown report and a loss-curve plot for a trained model, from its step outputs.

``write_model_card(training_output, output_dir)`` writes them from any finished ``train_lm`` output
folder; ``model_report(name, model=..., evaluations=[...])`` declares it as a cached step; ``marin
report STEP-OR-PATH`` runs it from the command line.
"""

from marin.reports.model_card import ModelCard, ReportSourceError, collect_card, render_markdown, write_model_card
from marin.reports.step import model_report

__all__ = ["ModelCard", "ReportSourceError", "collect_card", "model_report", "render_markdown", "write_model_card"]
