"""Command-line tools: ``tide`` for operators and developers."""
