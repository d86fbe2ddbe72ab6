"""The agents ``flywheel demo`` trains, with their tasks and data; each imports nothing of Flywheel.

``calc_agent``: a calculator agent in plain ``openai`` code; ``sql_agent``: a LangGraph text-to-SQL
agent. The demo runs them from the checkout (``examples/demo/agents.py``); they are not in the wheel.
"""
