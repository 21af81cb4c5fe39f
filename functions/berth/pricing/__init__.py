"""Cloud price catalog shipped with Berth (list prices snapshot; see README.md here)."""
