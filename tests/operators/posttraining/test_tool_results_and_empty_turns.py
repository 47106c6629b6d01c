"""Tool calls that never get a result, and empty user turns: chat_quality and trajectory_quality drop them with
their own reason (a broken record is never silently trained on), and keep the good shapes: parallel calls each
answered, a conversation that ends on the call it teaches, a step that carries its result."""

from __future__ import annotations

from tests.operators.posttraining.test_posttraining_ops import _assistant, _run, _user


def _call(call_id, name="weather", arguments='{"city": "Paris"}'):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool(call_id, content):
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_chat_tool_calls_without_a_result_are_dropped(tmp_path):
    records = [
        # kept: one call, answered
        {"messages": [_user("Weather in Paris?"), _assistant(None, tool_calls=[_call("a")]), _tool("a", "12C"),
                      _assistant("It is 12C.")]},
        # kept: two parallel calls, both answered
        {"messages": [_user("Paris and Rome?"), _assistant(None, tool_calls=[_call("b"), _call("c")]),
                      _tool("b", "12C"), _tool("c", "20C"), _assistant("12C and 20C.")]},
        # kept: the conversation ends on the call (a function-calling SFT target; the result is not part of it)
        {"messages": [_user("Weather in Oslo?"), _assistant(None, tool_calls=[_call("d")])]},
        # dropped: the call gets no result, the user just goes on
        {"messages": [_user("Weather in Rome?"), _assistant(None, tool_calls=[_call("e")]), _user("Well?"),
                      _assistant("Sunny.")]},
        # dropped: two calls, one result
        {"messages": [_user("Oslo and Bergen?"), _assistant(None, tool_calls=[_call("f"), _call("g")]),
                      _tool("f", "1C"), _assistant("1C in Oslo, Bergen unknown.")]},
    ]
    kept, dropped, result = _run(tmp_path, "chat", records, {"turns": {"op": "chat_quality"}})
    assert result.counts["dropped"] == {"unanswered_tool_call": 2}, result.counts
    assert kept.num_rows == 3
    signal = dict(zip(kept.column("text").to_pylist(),
                      kept.column("quality").combine_chunks().field("chat_unanswered_tool_calls").to_pylist()))
    assert set(signal.values()) == {0}


def test_chat_empty_user_turn_is_dropped(tmp_path):
    records = [
        {"messages": [_user("Hi"), _assistant("Hello!")]},
        {"messages": [_user(""), _assistant("You sent nothing; how can I help?")]},
        {"messages": [_user("  \n"), _assistant("Anything else?")]},
        {"messages": [{"role": "system", "content": ""}, _user("Hi"), _assistant("Hello!!")]},  # empty system: fine
    ]
    kept, _, result = _run(tmp_path, "chat", records, {"turns": {"op": "chat_quality"}})
    assert result.counts["dropped"] == {"empty_user_turn": 2}, result.counts
    assert kept.num_rows == 2
    kept, _, result = _run(tmp_path / "off", "chat", records,
                           {"turns": {"op": "chat_quality", "params": {"drop_empty_user": False}}})
    assert result.counts["dropped_total"] == 0 and kept.num_rows == 4


def test_trajectory_tool_call_without_a_result_is_flagged_and_dropped_only_when_asked(tmp_path):
    """drop_unanswered_tool_calls defaulted to true and dropped every ReAct / SWE-agent episode (the tool's output is
    the next step's observation) of a job that upgraded without changing its spec: it is opt-in; the signal stays."""
    episodes = [
        {"episode_id": "ok", "steps": [{"observation": "disk full", "tool_call": {"name": "df", "arguments": {}},
                                        "tool_result": "98%"}, {"observation": "98%", "action": "rm -r /tmp/x"}]},
        {"episode_id": "no-result", "steps": [{"observation": "disk full", "tool_call": {"name": "df", "arguments": {}}},
                                              {"observation": "?", "action": "exit", "done": True}]},
    ]
    kept, _, result = _run(tmp_path, "trajectory", episodes, {"steps": {"op": "trajectory_quality"}})
    assert result.counts["dropped_total"] == 0 and kept.num_rows == 2, result.counts
    signals = dict(zip(kept.column("episode_id").to_pylist(),
                       kept.column("quality").combine_chunks().field("traj_unanswered_tool_calls").to_pylist()))
    assert signals == {"ok": 0, "no-result": 1}
    kept, _, result = _run(tmp_path / "on", "trajectory", episodes,
                           {"steps": {"op": "trajectory_quality", "params": {"drop_unanswered_tool_calls": True}}})
    assert result.counts["dropped"] == {"unanswered_tool_call": 1}, result.counts
    assert kept.column("episode_id").to_pylist() == ["ok"]


def test_a_tool_reply_to_another_call_id_leaves_the_call_unanswered(tmp_path):
    """The reply's tool_call_id names a call that was not made (the API refuses such a conversation): the call made
    got no result. Replies without ids (ShareGPT observations) are matched by count alone."""
    records = [
        {"messages": [_user("Weather in Paris?"), _assistant(None, tool_calls=[_call("a")]), _tool("b", "12C"),
                      _assistant("It is 12C.")]},
        {"messages": [_user("Paris and Rome?"), _assistant(None, tool_calls=[_call("c"), _call("d")]),
                      _tool("d", "20C"), _tool("c", "12C"), _assistant("12C and 20C.")]},  # any order is fine
        {"conversations": [{"from": "human", "value": "Weather?"},
                           {"from": "function_call", "value": "{\"name\": \"weather\", \"arguments\": {}}"},
                           {"from": "observation", "value": "12C"}, {"from": "gpt", "value": "12C."}]},
    ]
    kept, _, result = _run(tmp_path, "chat", records, {"turns": {"op": "chat_quality"}})
    assert result.counts["dropped"] == {"unanswered_tool_call": 1}, result.counts
    assert kept.num_rows == 2
