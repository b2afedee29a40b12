"""Alias of `specdec.bench.report` (the paper's Tables 2-4 as Markdown), kept for the
name's existing users; new code imports `specdec.bench.report`."""

from specdec.bench.report import *  # noqa: F401,F403
