"""Write provisioner/keywords.py (the typed keywords of the Python API) from the option
declarations: `python scripts/generate_keywords.py` after adding or changing an option."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provisioner.options import KEYWORDS_MODULE, keywords_source  # noqa: E402

if __name__ == "__main__":
    (ROOT / KEYWORDS_MODULE).write_text(keywords_source())
    print(f"wrote {KEYWORDS_MODULE}")
