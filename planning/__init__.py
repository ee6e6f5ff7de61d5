"""Planning: what each server needs (memory, start-up time) and where it fits, before anything is applied."""
