"""Op folders: each holds spec.py (the op contract), launcher templates for the
production variants, and kernel.cu (the optimized kernel the project ships)."""
