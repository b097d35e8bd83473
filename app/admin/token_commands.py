"""`orderly admin token create|list|revoke`: personal API tokens for automation (I/O shell; DESIGN.md §3.1).

Run where PostgreSQL is reachable (the environment, or a running `orderly dev`'s stack.json). A
token made here is owned and audited as the OS user who ran the command (``cli:<user>``); it is
printed once and stored hashed, like those made at the console (app/admin/tokens.py).
"""

from __future__ import annotations

import argparse
import secrets

from app.admin import auth, queries, tokens
from app.admin.commands import _actor, _connect, _json, _table
from app.settings import Settings


def add_token(parser: argparse.ArgumentParser) -> None:
    found = parser.add_subparsers(dest="action", required=False, metavar="{token}")
    token = found.add_parser("token", help="personal API tokens for automation: create, list, revoke",
                             description="Personal API tokens for automation, owned and audited as the OS user.")
    verbs = token.add_subparsers(dest="verb", required=True, metavar="{create,list,revoke}")
    create = verbs.add_parser("create", help="a new token, printed once")
    create.add_argument("--name", required=True)
    create.add_argument("--role", required=True, choices=auth.ROLES)
    create.add_argument("--expires-days", type=int, default=30, help=f"1 to {tokens.MOST_DAYS} (default 30)")
    listing = verbs.add_parser("list", help="your tokens with their last use")
    listing.add_argument("--json", action="store_true", help='print {"items": [...]} as the admin API answers')
    revoke = verbs.add_parser("revoke", help="revoke one of your tokens by id")
    revoke.add_argument("token_id", type=int)


async def run(settings: Settings, args: argparse.Namespace) -> int:
    owner = _actor()
    if args.verb == "create" and not (1 <= args.expires_days <= tokens.MOST_DAYS and args.name.strip()):
        print(f"orderly admin token create: --expires-days from 1 to {tokens.MOST_DAYS} and a non-blank --name")
        return 2
    conn = await _connect(settings)
    try:
        if args.verb == "create":
            token = tokens.PREFIX + secrets.token_urlsafe(32)
            made = await conn.fetchrow(tokens.CREATE, args.name.strip()[:100], owner, args.role,
                                       auth.digest(token), args.expires_days)
            assert made is not None  # INSERT … RETURNING answers its row
            await queries.audit(conn, owner, "token.create", f"{made['id']} {made['name']}",
                                f"{args.role} until {made['expires_at'].isoformat()}")
            print(f"token {made['id']} ({args.role}, until {made['expires_at']:%Y-%m-%d}); shown this once:\n{token}")
            return 0
        if args.verb == "list":
            rows = [dict(r) for r in await conn.fetch(tokens.LIST, owner)]
            if args.json:
                return _json(rows)
            _table(rows, [("id", "ID", 6), ("name", "NAME", 20), ("role", "ROLE", 9), ("expires_at", "EXPIRES", 26),
                          ("last_used_at", "LAST USED", 26), ("revoked_at", "REVOKED", 26)])
            return 0
        name = await conn.fetchval(tokens.REVOKE, args.token_id, owner)
        await queries.audit(conn, owner, "token.revoke", str(args.token_id), "revoked" if name else "refused: unknown")
        print(f"token {args.token_id} revoked" if name else f"no token {args.token_id} of {owner}")
        return 0 if name else 1
    finally:
        await conn.close()
