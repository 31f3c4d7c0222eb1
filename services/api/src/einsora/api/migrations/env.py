from einsora.store.migrations import run_env

run_env()
