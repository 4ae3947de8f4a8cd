"""Analysis maths shared by the Lightning callbacks and the evaluation tasks: which keys each head keeps alive
(survival), loss by position in long documents (positions) and KV-cache pruning (pruning)."""
