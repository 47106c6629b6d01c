"""Writes the bundled post-training demo data (run from the repo root: python data/posttraining/make_data.py)."""
import json, random
out = "data/posttraining/"
def w(name, rows):
    with open(out + name, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")

sys_msg = {"role": "system", "content": "You are a concise assistant for a Linux operations team."}
openai = [
    {"id": "c1", "messages": [sys_msg, {"role": "user", "content": "How do I list the ten largest files under /var/log?"},
        {"role": "assistant", "content": "Run `du -ah /var/log | sort -rh | head -n 10`. It prints sizes in human-readable units, largest first."}]},
    {"id": "c2", "messages": [{"role": "user", "content": "What does the sticky bit on /tmp do?"},
        {"role": "assistant", "content": "It lets every user create files in /tmp but only the owner of a file (or root) may delete or rename it."},
        {"role": "user", "content": "And how do I set it on another directory?"},
        {"role": "assistant", "content": "Use `chmod +t DIR`, or the octal form `chmod 1777 DIR` for a world-writable shared directory."}]},
    {"id": "c3", "messages": [{"role": "user", "content": "Please e-mail the on-call report to maria.lopez@example.org and call me at +1 415 555 0134 if it fails."},
        {"role": "assistant", "content": "I cannot send e-mail myself, but here is a draft addressed to maria.lopez@example.org with the report attached as text."}]},
    {"id": "c4", "tools": [{"type": "function", "function": {"name": "get_disk_usage", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}],
     "messages": [{"role": "user", "content": "How full is the root filesystem?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_disk_usage", "arguments": "{\"path\": \"/\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"used_percent\": 71.5}"},
        {"role": "assistant", "content": "The root filesystem is 71.5% full."}]},
    {"id": "c5", "messages": [{"role": "user", "content": "Check the uptime of web-01."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "uptime", "arguments": "{\"host\": \"web-01\""}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "error: bad arguments"},
        {"role": "assistant", "content": "The tool call failed; I will retry with valid arguments."}]},
    {"id": "c6", "messages": [{"role": "user", "content": "Summarize what systemd timers are for."},
        {"role": "assistant", "content": "   "}]},
    {"id": "c7", "messages": [{"role": "assistant", "content": "Hello! I am here to help."},
        {"role": "assistant", "content": "What would you like to do today?"}]},
    {"id": "c8", "messages": [{"role": "user", "content": "How do I list the ten largest files under /var/log?"},
        {"role": "assistant", "content": "Try `find /var/log -type f -printf '%s %p\\n' | sort -nr | head`, which sorts by bytes."}]},
    {"id": "c9", "messages": [{"role": "user", "content": "Explain what `set -euo pipefail` does in a bash script."},
        {"role": "assistant", "content": "It makes the script exit on the first failing command (-e), treat unset variables as errors (-u), and fail a pipeline when any command in it fails (pipefail), so the"}]},
    # malformed
    '{"id": "bad1", "messages": [{"role": "robot", "content": "beep"}]}',
    '{"id": "bad2", "messages": []}',
    '{"id": "bad3", "messages": [{"role": "user", "content": {"text": 5}}]}',
    '{"id": "bad4", "prompt": "no messages field here"}',
    '{"id": "bad5", "messages": [{"role": "user", "content": "unterminated',
]
w("chat-openai.jsonl", openai)
sharegpt = [
    {"id": "s1", "conversations": [{"from": "system", "value": "You answer questions about Python packaging."},
        {"from": "human", "value": "What is the difference between a wheel and an sdist?"},
        {"from": "gpt", "value": "An sdist is the source archive that must be built on install; a wheel is a pre-built archive that pip installs by unpacking, with no build step."}]},
    {"id": "s2", "conversations": [{"from": "human", "value": "Which file declares build requirements in a modern project?"},
        {"from": "gpt", "value": "pyproject.toml, in its [build-system] table: requires lists the build dependencies and build-backend names the backend."}]},
    {"id": "s3", "conversations": [{"from": "human", "value": "Look up the latest version of requests."},
        {"from": "function_call", "value": "{\"name\": \"pypi_latest\", \"arguments\": {\"package\": \"requests\"}}"},
        {"from": "observation", "value": "2.32.3"},
        {"from": "gpt", "value": "The latest release of requests on PyPI is 2.32.3."}]},
    {"id": "s4", "conversations": [{"from": "human", "value": "hi"}, {"from": "wizard", "value": "??"}]},
    {"id": "s5", "conversations": "not a list"},
]
w("chat-sharegpt.jsonl", sharegpt)
pref = [
    {"prompt": "Write a one-line shell command that counts the lines of all .py files in the current directory tree.",
     "chosen": "find . -name '*.py' -print0 | xargs -0 cat | wc -l", "rejected": "wc -l *.py", "score_chosen": 9.0, "score_rejected": 4.0},
    {"prompt": "Is it safe to run `chmod -R 777 /` to fix a permission error?",
     "chosen": "No. It makes every file world-writable, breaks setuid programs and ssh key checks, and is very hard to undo. Fix the permissions of the one path that fails instead.",
     "rejected": "Yes, that will fix any permission error quickly.", "score_chosen": 10, "score_rejected": 1},
    {"chosen": [{"role": "user", "content": "What port does SSH use by default?"}, {"role": "assistant", "content": "Port 22 over TCP."}],
     "rejected": [{"role": "user", "content": "What port does SSH use by default?"}, {"role": "assistant", "content": "Port 80."}]},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a tool that shows per-process network usage."}],
     "chosen": [{"role": "assistant", "content": "nethogs"}], "rejected": [{"role": "assistant", "content": "ls"}]},
    {"prompt": "Contact support?", "chosen": "Write to help@example.com with your order number.", "rejected": "Call 415-555-0199 any time.",
     "score_chosen": 6, "score_rejected": 5},
    {"prompt": "Same answer twice?", "chosen": "Yes.", "rejected": "Yes."},
    {"prompt": "Write a one-line shell command that counts the lines of all .py files in the current directory tree.",
     "chosen": "git ls-files '*.py' | xargs wc -l | tail -n 1", "rejected": "cat *.py"},
    # malformed
    '{"prompt": "missing the rejected side", "chosen": "ok"}',
    '{"prompt": "bad score", "chosen": "a", "rejected": "b", "score_chosen": "high"}',
    '{"prompt": "bad message", "chosen": [{"role": "assistant"}], "rejected": [{"content": "no role"}]}',
    'not json at all',
]
w("preference.jsonl", pref)
rng = random.Random(7)
long_steps = []
for i in range(2500):
    long_steps.append({"observation": f"terminal: step {i}, {rng.randint(0, 9999)} bytes free in /scratch",
                       "action": rng.choice(["ls -la /scratch", "df -h /scratch", "rm /scratch/tmp.%d" % i, "sleep 1"]),
                       "reward": 0.0 if i < 2499 else 1.0, "done": i == 2499})
traj = [
    {"episode_id": "ep-1", "task": "free disk space", "steps": [
        {"observation": "df reports /var at 98% used", "action": "du -sh /var/* | sort -rh | head -3", "reward": 0.0},
        {"observation": "/var/log 41G", "tool_call": {"name": "rotate_logs", "arguments": {"path": "/var/log", "keep": 3}}, "tool_result": "rotated 212 files", "reward": 0.5},
        {"observation": "df reports /var at 55% used", "action": "echo done", "reward": 1.0, "done": True}]},
    {"episode_id": "ep-2", "task": "restart a failed service", "steps": [
        {"observation": "nginx.service: failed", "action": "journalctl -u nginx -n 20"},
        {"observation": "bind() to 0.0.0.0:80 failed (98: Address already in use)", "action": "ss -ltnp 'sport = :80'"},
        {"observation": "apache2 is listening on :80", "action": "systemctl stop apache2 && systemctl start nginx", "reward": 1.0, "done": True}]},
    {"episode_id": "ep-3", "task": "clean scratch (long episode)", "steps": long_steps},
    {"episode_id": "ep-4", "task": "tool call with unparseable arguments", "steps": [
        {"observation": "need the weather", "tool_call": "{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"", "tool_result": "error", "reward": 0.0, "done": True}]},
    # malformed
    '{"episode_id": "bad-1", "steps": []}',
    '{"episode_id": "bad-2", "steps": [{"observation": "ok", "reward": "high"}]}',
    '{"episode_id": "bad-3", "steps": [{"observation": "ok"}, {"done": "yes", "action": "x"}]}',
    '{"episode_id": "bad-4", "actions": ["ls"]}',
]
w("trajectory.jsonl", traj)
