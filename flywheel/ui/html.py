"""The pieces every page shares: the layout, escaping, numbers, the error page.

Pages are plain strings built with :func:`esc` around every value that came from the event log or the
request (``html.escape``, quotes included): nothing recorded is ever written into a page unescaped.
"""

from __future__ import annotations

import math
from html import escape

from fastapi.responses import HTMLResponse


def esc(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def layout(prefix: str, title: str, body: str, *, active: str = "", scripts: tuple[str, ...] = ()) -> str:
    nav = "".join(
        f'<a href="{prefix}/{href}" class="{"on" if name == active else ""}">{label}</a>'
        for name, href, label in (
            ("episodes", "", "Episodes"),
            ("training", "training", "Training"),
            ("versions", "versions", "Versions"),
        )
    )
    tags = "".join(f'<script src="{prefix}/static/{esc(s)}"></script>' for s in scripts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · Flywheel</title>
<link rel="stylesheet" href="{prefix}/static/ui.css">
</head><body data-prefix="{esc(prefix)}">
<header><strong>Flywheel</strong><nav>{nav}</nav></header>
<main>{body}</main>
{tags}
</body></html>"""


def error_page(prefix: str, status: int, message: str) -> HTMLResponse:
    titles = {400: "Bad request", 401: "Sign in", 404: "Not found", 503: "Unavailable", 504: "Too slow"}
    title = titles.get(status, "Error")
    body = f'<h1>{status} · {esc(title)}</h1><p class="error" id="error">{esc(message)}</p>'
    body += f'<p><a href="{prefix}/">Back to the episodes</a></p>'
    return HTMLResponse(layout(prefix, title, body), status_code=status)


def login_page(prefix: str, message: str = "", status: int = 401) -> HTMLResponse:
    note = f'<p class="error" id="error">{esc(message)}</p>' if message else ""
    body = f"""<h1>Sign in</h1>{note}
<form method="post" action="{prefix}/login" class="login">
<label>Admin token (FLYWHEEL_ADMIN_TOKEN)
<input type="password" name="token" id="token" autocomplete="current-password" required></label>
<button type="submit" id="signin">Sign in</button></form>"""
    return HTMLResponse(layout(prefix, "Sign in", body), status_code=status)
