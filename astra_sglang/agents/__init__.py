"""`astra-sglang optimize`: the multi-agent optimization loop (the Astra paper's Algorithm 1).

A deterministic orchestrator (orchestrator.py) owns the loop: rounds, budgets, which candidate a
round starts from, the JSONL log, resume, and the final re-verification and report. The agents
(roles.py) run on the OpenAI Agents SDK (`agents`, the optional `[agents]` extra), imported lazily
so this package installs beside SGLang's exact openai pin. Their tools (tools.py) are functions
over the round's context (context.py) that the SDK passes in; modules depend one way only:
executor/report/runlog/budget -> workload, cute -> context -> tools -> roles -> orchestrator -> cli. Candidates are compiled, checked and
timed through an executor (executor.py): the real one calls astra_sglang.harness (check / bench)
on a GPU; a CPU stand-in (standin.py) runs C candidates for tests and demos. Nothing here imports
sglang.
"""
