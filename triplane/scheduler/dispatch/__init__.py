"""The task state machine and its asyncio shell (the distributed-runtime issue)."""
