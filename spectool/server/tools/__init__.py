"""Tool calls: a request's tools, each family's call format (formats.py), the call's grammar, calls
read back."""

from spectool.server.tools.calls import ToolError, Tools, read, template_messages
from spectool.server.tools.formats import detect

__all__ = ["ToolError", "Tools", "detect", "read", "template_messages"]
