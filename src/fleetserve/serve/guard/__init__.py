"""Who may send what: API keys and tenants, tenant quotas (the arithmetic, the shared
counters, the guard around each request), exact per-model admission with weighted fair
queuing, and the token usage a response reports."""
