"""One episode's page: its summary and score, then each call in order with its tokens.

Each generated token is a ``<span class="tok">`` coloured by its behaviour probability (red: unlikely,
green: likely) with the logprob in its tooltip and in ``data-logprob`` (the browser test reads them).
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from flywheel.ui.episode import CallView, ChoiceView, EpisodeView, Token
from flywheel.ui.html import esc, layout, num


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _content(content: Any) -> str:
    if isinstance(content, str):
        return f'<div class="text">{esc(content)}</div>'
    if isinstance(content, list):
        parts = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            parts.append(esc(text) if isinstance(text, str) else f"<pre>{esc(_json(part))}</pre>")
        return f'<div class="text">{"".join(parts)}</div>'
    return "" if content is None else f"<pre>{esc(_json(content))}</pre>"


def _tool_calls(calls: list[Any]) -> str:
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            out.append(
                f'<div class="tool-call">→ <b>{esc(fn.get("name"))}</b>'
                f"(<code>{esc(fn.get('arguments'))}</code>) <small>{esc(call.get('id'))}</small></div>"
            )
        else:
            out.append(f"<pre>{esc(_json(call))}</pre>")
    return "".join(out)


def _message(m: Any) -> str:
    if not isinstance(m, dict):
        return f'<div class="msg"><pre>{esc(_json(m))}</pre></div>'
    role = str(m.get("role") or m.get("type") or "?")
    extra = f" <small>for {esc(m['tool_call_id'])}</small>" if m.get("tool_call_id") else ""
    listed = m.get("tool_calls")
    calls: list[Any] = listed if isinstance(listed, list) else []
    return (
        f'<div class="msg role-{esc(role)}"><span class="role">{esc(role)}{extra}</span>'
        f"{_content(m.get('content'))}{_tool_calls(calls)}</div>"
    )


def _colour(logprob: float | None) -> str:
    if logprob is None:
        return "#eee"
    p = math.exp(max(logprob, -50.0))
    return f"hsl({round(120 * p)}, 75%, 78%)"


def token_span(t: Token) -> str:
    lp = "" if t.logprob is None else f"{t.logprob:.6g}"
    tip = f"id {t.token_id} · logprob {lp or 'none'}"
    if t.logprob is not None:
        tip += f" · p {math.exp(max(t.logprob, -50.0)):.3f}"
    return (
        f'<span class="tok" data-id="{t.token_id}" data-logprob="{lp}" title="{esc(tip)}" '
        f'style="background:{_colour(t.logprob)}">{esc(t.text)}</span>'
    )


def _choice(c: ChoiceView) -> str:
    tokens = "".join(token_span(t) for t in c.tokens)
    lps = [t.logprob for t in c.tokens if t.logprob is not None]
    summary = f"{len(c.tokens)} tokens" + (f", mean logprob {sum(lps) / len(lps):.3f}" if lps else "")
    strip = f'<div class="tokens" data-choice="{c.index}">{tokens}</div>' if c.tokens else ""
    return (
        f'<div class="choice"><span class="role">assistant · choice {c.index} · '
        f"{esc(c.finish_reason or '')} · {summary}</span>"
        f"{_content(c.text) if c.text else ''}{_tool_calls(c.tool_calls)}{strip}</div>"
    )


def _badges(cv: CallView) -> str:
    call = cv.call
    out = [
        f"weights v{call.weight_version}"
        + (f" ({call.weight_version_source})" if call.weight_version_source else "")
    ]
    out.append(f"prompt {esc(call.prompt_version)}" if call.prompt_version else "agent's own prompt")
    if call.adapter:
        out.append(
            f"adapter {esc(call.adapter)} v{call.adapter_version if call.adapter_version is not None else '?'}"
        )
    out.append("token-faithful" if call.token_faithful else "not token-faithful")
    if call.prefix_mismatch:
        out.append('<b class="split">prefix mismatch: a new trajectory starts here</b>')
    elif call.extends_previous:
        out.append("extends the previous call")
    if cv.trajectory is not None:
        out.append(f"trajectory {cv.trajectory}")
    if cv.call_return is not None:
        out.append(f"return {num(cv.call_return)}")
    for r in cv.rewards:
        out.append(f'<b class="reward">reward {num(r.value)} ({esc(r.origin.value)})</b>')
    if call.error:
        out.append(f'<b class="error">error {call.status_code}: {esc(call.error)}</b>')
    return " · ".join(out)


def _call(cv: CallView) -> str:
    call = cv.call
    head = (
        f"Call {call.call_seq} <small>{esc(call.endpoint)} · {esc(call.model)} · "
        f"{call.prompt_tokens} → {call.completion_tokens} tokens · {call.latency_ms:.0f} ms</small>"
    )
    subs = "".join(
        f'<div class="sub">prompt component <b>{esc(s.component)}</b> substituted: '
        f"<del>{esc(s.original[:200])}</del> → {esc(s.substituted[:200])}</div>"
        for s in call.prompt_substitutions
    )
    earlier = len(cv.all_messages) - len(cv.new_messages)
    older = (
        f"<details><summary>{earlier} earlier message(s)</summary>"
        f"{''.join(_message(m) for m in cv.all_messages[:earlier])}</details>"
        if earlier
        else ""
    )
    return (
        f'<section class="call" id="call-{call.call_seq}" data-seq="{call.call_seq}">'
        f'<h2>{head}</h2><p class="badges">{_badges(cv)}</p>{subs}{older}'
        f"{''.join(_message(m) for m in cv.new_messages)}"
        f"{''.join(_choice(c) for c in cv.choices)}</section>"
    )


def _summary(v: EpisodeView) -> str:
    s, started, finished = v.scored, v.started, v.finished
    task = (started.get("task") or {}).get("task_id") if isinstance(started.get("task"), dict) else None
    rows: list[tuple[str, str]] = [
        ("task", esc(task or (s.task_id if s else "") or "")),
        ("source", esc(started.get("source") or (s.source.value if s else ""))),
        ("tenant", esc(started.get("tenant") or (s.tenant if s else "") or "")),
        ("session", esc(started.get("session_id") or "")),
        ("status", esc((s.status.value if s else None) or finished.get("status") or "running")),
        ("reward", f'<span id="reward">{num(s.reward if s else finished.get("reported_reward"))}</span>'),
    ]
    if s is not None:
        rows += [
            ("reward source", esc(s.reward_source)),
            ("score revision", str(s.score_revision)),
            (
                "transitions",
                f"{len(s.transitions)} from {s.num_calls} calls ({s.context_calls} context only)",
            ),
            ("prefix mismatches", str(s.prefix_mismatches)),
        ]
        for label, text in (("score note", s.score_note), ("score error", s.score_error),
                            ("unusable", s.unusable_reason)):  # fmt: skip
            if text:
                rows.append((label, f'<span class="note">{esc(text)}</span>'))
    if finished.get("error"):
        rows.append(("agent error", f'<span class="error">{esc(finished["error"])}</span>'))
    return (
        '<table class="kv">' + "".join(f"<tr><th>{k}</th><td>{val}</td></tr>" for k, val in rows) + "</table>"
    )


def _trajectories(v: EpisodeView) -> str:
    if v.scored is None or not v.scored.transitions:
        return ""
    rows = "".join(
        f"<tr><td>{i}</td><td>{esc(', '.join(map(str, t.call_seqs)))}</td><td>{len(t.prompt_ids)}</td>"
        f"<td>{sum(t.response_mask)} / {len(t.response_ids)}</td><td>{t.weight_version}</td>"
        f"<td>{esc(t.policy or '')}</td><td>{num(t.reward)}</td></tr>"
        for i, t in enumerate(v.scored.transitions)
    )
    return (
        '<h2>Trajectories</h2><table class="list" id="trajectories"><thead><tr><th>#</th>'
        "<th>calls merged</th><th>prompt tokens</th><th>generated / response tokens</th><th>weights</th>"
        f"<th>policy</th><th>reward</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _feedback(v: EpisodeView) -> str:
    if not v.feedback:
        return ""
    items = "".join(
        f'<li class="feedback">{esc(r.emitted_at.strftime("%Y-%m-%d %H:%M:%S"))} · {esc(r.origin.value)} · '
        f"value {num(r.value)}" + (f" · rating {r.rating}" if r.rating is not None else "")
        + (f" · “{esc(r.message)}”" if r.message else "") + "</li>"
        for r in v.feedback
    )  # fmt: skip
    return f'<h2>Feedback and rewards</h2><ul id="feedback">{items}</ul>'


def episode_page(prefix: str, v: EpisodeView, last_event: str) -> str:
    calls = "".join(_call(cv) for cv in v.calls) or "<p>no calls recorded</p>"
    note = f"<p class='error'>{v.undecodable} event(s) could not be read</p>" if v.undecodable else ""
    body = (
        f'<h1 data-last="{esc(last_event)}" id="episode" data-episode="{esc(v.episode_id)}">'
        f"Episode <code>{esc(v.episode_id)}</code></h1>{note}{_summary(v)}{_feedback(v)}{_trajectories(v)}"
        f'<p class="legend">token colour: behaviour probability, <span class="tok" style="background:'
        f'{_colour(math.log(0.05))}">p≈0</span> … <span class="tok" style="background:{_colour(0.0)}">'
        f"p=1</span> (hover a token for its logprob)</p>{calls}"
    )
    return layout(prefix, f"Episode {v.episode_id[:12]}", body, active="episodes", scripts=("ui.js",))
