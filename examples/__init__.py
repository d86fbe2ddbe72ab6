"""Agents on other frameworks, and the small agents the tests drive; not shipped in the wheel."""
