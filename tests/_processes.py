"""Processes read from /proc (Linux), for the tests that check a killed runner leaves none behind."""
from pathlib import Path


def state_and_parent(pid: int | str) -> tuple[str, int] | None:
    """The process's state letter and parent pid from /proc (None once it has ended). The command name may hold
    spaces and parentheses, so the fields are read after its last ')'."""
    try:
        state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    except OSError:
        return None
    return state, int(ppid)


def processes_naming(text: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        stat = state_and_parent(entry.name) if entry.name.isdigit() else None
        if stat is None or stat[0] == "Z":
            continue
        try:
            if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:  # the process ended while we looked
            pass
    return found
