"""provision: size disaggregated LLM inference clusters (search engine, reports, CLI)."""
__version__ = "0.1.0"
