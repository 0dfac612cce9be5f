"""`--help` that shows every default: argparse's ArgumentDefaultsHelpFormatter, minus the noise.

Adds " (default: X)" to each option's help unless the text already names its default or there is nothing to
show (no default, a False switch). Keeps the description's own line breaks (RawDescriptionHelpFormatter).
"""

from __future__ import annotations

import argparse


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        if not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
