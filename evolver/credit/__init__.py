"""Step judges for step-level credit: oracle and env (judges.py), llm (llm.py)."""
