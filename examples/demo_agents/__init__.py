"""The agents ``flywheel demo`` trains, with their tasks and data; each imports nothing of Flywheel.

``calc_agent``: a calculator agent in plain ``openai`` code; ``sql_agent``: a LangGraph text-to-SQL
agent. Shipped in the wheel because the demo runs them (``examples/demo/agents.py``).
"""
