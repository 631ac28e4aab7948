"""Run reports: figures and the pages that embed them."""
