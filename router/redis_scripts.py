"""The Lua scripts behind the Redis prefix index and load board, and how they are called.

Each store operation that must be atomic or must not pay one round trip per
block is one script here, run with ``EVALSHA``. The sources live in Python
strings (not ``.lua`` files) so that they ship in the wheel without package
data. :class:`LuaScript` keeps the SHA1 and loads the source the first time
the server answers ``NOSCRIPT`` — on first use, and again after a Redis
restart, which forgets every loaded script.

Conventions shared by all scripts (see :mod:`vertumnus.router.redis_store`
for the key layout):

- ``KEYS[1]`` is one key of the store (its meta hash, or the load board's
  replica set): it routes the call to the right node of a cluster. The other
  keys are built from ``ARGV[1]``, the store's prefix ``vt:{<ns>}:``; the
  braces are a hash tag, so every one of them is in ``KEYS[1]``'s slot and
  the script stays legal on a cluster.
- Block keys, parents and workers are **strings** in Lua: keys are 64-bit
  and Lua 5.1's numbers are doubles, which would round them. Only depths,
  positions, generations and cursors are numbers (far below 2^53), written
  back with ``%d`` so they never turn into ``1e+15``.
- Lists of keys travel as one comma-separated argument, and the hot path's
  answer as one string (see ``_HELPERS`` and ``MATCH``): redis-py packs and
  parses every argument and array element in Python.
- A script returns numbers as integers; a float (the load board's seconds)
  travels as a string.
- Accessing keys not listed in ``KEYS`` is allowed for scripts without a
  shebang flags line (these have none) as long as they hash to the same slot.
"""

from __future__ import annotations

import hashlib
from typing import Any

from redis.exceptions import NoScriptError

__all__ = ["APPLY", "CHANGES", "LOADBOARD", "MATCH", "PATH", "LuaScript"]


class LuaScript:
    """One Lua script, called by SHA1 (``EVALSHA``) and loaded on ``NOSCRIPT``."""

    __slots__ = ("name", "source", "sha")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Any, keys: list[Any], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            pass  # first use on this server, or the server restarted: load it below
        loaded = client.script_load(self.source)
        if isinstance(loaded, bytes):
            loaded = loaded.decode()
        if loaded != self.sha:  # cannot happen unless the server hashes differently
            raise RuntimeError(f"Redis loaded script {self.name} as {loaded}, not {self.sha}")
        return client.evalsha(self.sha, len(keys), *keys, *args)

    def __repr__(self) -> str:
        return f"LuaScript({self.name!r}, sha={self.sha[:12]})"


# Helpers shared by the index scripts. Lists of keys travel as one
# comma-separated argument: redis-py packs each argument separately (about 1 µs
# apiece in Python), so a 256-block chain as 256 arguments cost more on the
# client than the whole walk on the server. Lua 5.1's unpack() is bounded by the
# C stack (about 8000 values), hence the chunks.
_HELPERS = r"""
local function split(s)
  local out = {}
  for v in string.gmatch(s, '[^,]+') do out[#out + 1] = v end
  return out
end

local CHUNK = 4000

local function call_chunked(cmd, key, list)
  local n = #list
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    redis.call(cmd, key, unpack(list, i, j))
    i = j + 1
  end
end
"""

APPLY = LuaScript(
    "apply",
    _HELPERS
    + r"""
-- One worker's event batch, all or nothing: the same algorithm as
-- vertumnus.core.trie.PrefixTrie.apply, run on an overlay of the blocks it
-- touches (read from Redis up front, two HMGETs for the whole batch), then
-- written back. A refusal returns before anything is written: Redis does not
-- roll a script back, so validating first is what makes the batch atomic.
--
-- KEYS[1] = prefix .. 'meta'
-- ARGV = prefix, worker, cleared ('1'|'0'), log_limit, token,
--        stored keys, their positions, their parents ('-': none), removed keys
--        (the last four comma-separated)
local META = KEYS[1]
local P = ARGV[1]
local worker = ARGV[2]
local cleared = ARGV[3] == '1'
local log_limit = ARGV[4]
local token = ARGV[5]
local ikeys, ipos, ipar, rkeys = split(ARGV[6]), split(ARGV[7]), split(ARGV[8]), split(ARGV[9])
local HOLD, BLK = P .. 'holders', P .. 'blocks'

local nodes = {}        -- key -> overlay entry (also for keys known to be absent)
local gen = nil         -- next generation, read on first use
local wfinal = {}       -- key -> whether `worker` holds it after the batch
local new, removed, gone = {}, {}, {}

-- Read every key of `list` that the overlay does not have yet.
local function fetch(list)
  local want, asked = {}, {}
  for _, k in ipairs(list) do
    if nodes[k] == nil and not asked[k] then want[#want + 1] = k; asked[k] = true end
  end
  local i = 1
  while i <= #want do
    local j = math.min(i + CHUNK - 1, #want)
    local meta = redis.call('HMGET', BLK, unpack(want, i, j))
    local hold = redis.call('HMGET', HOLD, unpack(want, i, j))
    for n = 1, j - i + 1 do
      local key = want[i + n - 1]
      if meta[n] then
        local d, g, nc, p = string.match(meta[n], '^(%d+),(%d+),(%d+),?(.*)$')
        local h, hn = {}, 0
        for w in string.gmatch(hold[n] or '', '[^,]+') do h[w] = true; hn = hn + 1 end
        nodes[key] = {key = key, live = true, was = true, d = tonumber(d), g = g,
                      p = p ~= '' and p or false, h = h, hn = hn, cn = tonumber(nc), cd = {}}
      else
        nodes[key] = {key = key, live = false, was = false, cn = 0, cd = {}}
      end
    end
    i = j + 1
  end
end

local function get(key)
  local e = nodes[key]
  if e == nil then fetch({key}); e = nodes[key] end
  if e.live then return e end
  return nil
end

-- A key that is not in the index (or left it earlier in this batch) enters as
-- a new incarnation: a fresh generation, no holders, no children.
local function create(key, depth, parent)
  local e = nodes[key]
  if gen == nil then
    gen = tonumber(redis.call('HGET', META, 'g'))
    if gen == nil then
      -- A new store (or one a restart emptied) counts from the server's clock in
      -- microseconds, not from 1: a block that comes back after a restart gets a
      -- generation it never had, so state kept elsewhere by (key, generation)
      -- is not carried over. Stays exact in a double for centuries.
      local t = redis.call('TIME')
      gen = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
  end
  e.live = true; e.d = depth; e.p = parent; e.g = string.format('%d', gen); gen = gen + 1
  e.h = {}; e.hn = 0; e.cn = 0; e.sdirty = true; e.hdirty = true
  return e
end

-- Children: the count lives in the block's own field (pruning asks it for
-- every block a drop visits, and an SCARD each would double a drop's cost);
-- the set changes as deltas, since a shared head may have thousands of
-- children and a batch adds or drops a few.
local function add_child(e, child)
  e.cn = e.cn + 1; e.sdirty = true
  e.cd[child] = (e.cd[child] or 0) + 1
end

local function del_child(e, child)
  e.cn = e.cn - 1; e.sdirty = true
  e.cd[child] = (e.cd[child] or 0) - 1
end

local function add_holder(e)
  if e.h[worker] then return false end
  e.h[worker] = true; e.hn = e.hn + 1; e.hdirty = true; wfinal[e.key] = true
  return true
end

local function del_holder(e)
  if not e.h[worker] then return false end
  e.h[worker] = nil; e.hn = e.hn - 1; e.hdirty = true; wfinal[e.key] = false
  return true
end

-- A block with no holder and no child leaves the index, and so may its
-- parent (a placeholder, or a block whose last holder left earlier).
local function prune(e)
  while e ~= nil and e.live and e.hn == 0 and e.cn == 0 do
    e.live = false; e.sdirty = true
    gone[#gone + 1] = e.key .. ':' .. e.g
    local parent = nil
    if e.p then parent = get(e.p) end
    if parent ~= nil then del_child(parent, e.key) end
    e = parent
  end
end

local function refuse(kind, key, spos, parent, other)
  return redis.error_reply(table.concat(
    {'VTREFUSED', kind, worker, key, spos, parent or '-', other or '-'}, ' '))
end

-- The parent an item names: created as a placeholder when unknown (it has a
-- child, so it stays; no holder, so it matches nobody), else its depth must
-- be the item's position.
local function parent_for(key, spos, pos, parent)
  local pe = get(parent)
  if pe == nil then return create(parent, pos, false), nil end
  if pe.d ~= pos then
    return nil, refuse('pdepth', key, spos, parent, string.format('%d', pe.d - 1))
  end
  return pe, nil
end

local function store()
  for i = 1, #ikeys do
    local key, spos, parent = ikeys[i], ipos[i], ipar[i]
    local pos = tonumber(spos)
    if parent == '-' then parent = false end
    if pos < 0 then return refuse('neg', key, spos, parent) end
    if pos == 0 and parent then return refuse('root', key, spos, parent) end
    local e = get(key)
    if e == nil then
      e = create(key, pos + 1, parent)
      if parent then
        local pe, err = parent_for(key, spos, pos, parent)
        if err then return err end
        add_child(pe, key)
      end
    else
      if e.d ~= pos + 1 then
        return refuse('depth', key, spos, parent, string.format('%d', e.d - 1))
      end
      if parent and e.p ~= parent then
        if e.p then return refuse('parent', key, spos, parent, e.p) end
        -- Learnt now (a per-rank event without parents came first).
        local pe, err = parent_for(key, spos, pos, parent)
        if err then return err end
        e.p = parent; e.sdirty = true
        add_child(pe, key)
      end
    end
    if add_holder(e) then new[#new + 1] = key end
  end
  return nil
end

-- 1. The clear comes first: every block of the worker leaves it.
if cleared then
  local keys = redis.call('SMEMBERS', P .. 'w:' .. worker)
  fetch(keys)
  for _, k in ipairs(keys) do
    local e = get(k)
    if e ~= nil and del_holder(e) then removed[#removed + 1] = k end
  end
  for _, k in ipairs(keys) do
    local e = get(k)
    if e ~= nil then prune(e) end
  end
end

-- 2. Stored blocks, each checked against the index and the batch so far.
local want = {}
for i = 1, #ikeys do
  want[#want + 1] = ikeys[i]
  if ipar[i] ~= '-' then want[#want + 1] = ipar[i] end
end
for _, k in ipairs(rkeys) do want[#want + 1] = k end
fetch(want)
local err = store()
if err then return err end

-- 3. Removed blocks (unknown keys, or keys the worker does not hold, are ignored).
for _, k in ipairs(rkeys) do
  local e = get(k)
  if e ~= nil and del_holder(e) then
    removed[#removed + 1] = k
    prune(e)
  end
end

-- Accepted: write the overlay back.
local bset, hset, dels, cdels = {}, {}, {}, {}
for key, e in pairs(nodes) do
  if e.live then
    if e.sdirty then
      bset[#bset + 1] = key
      bset[#bset + 1] = string.format('%d,%s,%d', e.d, e.g, e.cn) .. (e.p and (',' .. e.p) or '')
    end
    if e.hdirty then
      local hs = {}
      for w in pairs(e.h) do hs[#hs + 1] = w end
      -- Sorted: equal holder sets are equal strings, which MATCH compares.
      table.sort(hs)
      hset[#hset + 1] = key
      hset[#hset + 1] = table.concat(hs, ',')
    end
    local adds, drops = {}, {}
    for c, v in pairs(e.cd) do
      if v > 0 then adds[#adds + 1] = c elseif v < 0 then drops[#drops + 1] = c end
    end
    if #adds > 0 then call_chunked('SADD', P .. 'c:' .. key, adds) end
    if #drops > 0 then call_chunked('SREM', P .. 'c:' .. key, drops) end
  elseif e.was then
    -- Gone: its fields, and its children set (empty by now) in one DEL per chunk.
    dels[#dels + 1] = key
    cdels[#cdels + 1] = P .. 'c:' .. key
  end
end
if #bset > 0 then call_chunked('HSET', BLK, bset) end
if #hset > 0 then call_chunked('HSET', HOLD, hset) end
if #dels > 0 then call_chunked('HDEL', BLK, dels); call_chunked('HDEL', HOLD, dels) end
local i = 1
while i <= #cdels do
  local j = math.min(i + CHUNK - 1, #cdels)
  redis.call('DEL', unpack(cdels, i, j))
  i = j + 1
end

local wkey = P .. 'w:' .. worker
local wadds, wdels = {}, {}
for k, v in pairs(wfinal) do
  if v then wadds[#wadds + 1] = k elseif not cleared then wdels[#wdels + 1] = k end
end
if cleared then redis.call('DEL', wkey) end
if #wadds > 0 then call_chunked('SADD', wkey, wadds) end
if #wdels > 0 then call_chunked('SREM', wkey, wdels) end
if cleared or #wadds > 0 or #wdels > 0 then
  if redis.call('EXISTS', wkey) == 1 then
    redis.call('SADD', P .. 'workers', worker)
  else
    redis.call('SREM', P .. 'workers', worker)
  end
end

if gen ~= nil then redis.call('HSET', META, 'g', string.format('%d', gen)) end
-- The incarnation: set by the first write to an empty store (after a restart
-- without persistence, say), so a follower can tell the log started over.
redis.call('HSETNX', META, 'inc', token)

local cursor = tonumber(redis.call('HGET', META, 'cur') or '0')
if #new > 0 or #removed > 0 or #gone > 0 or cleared then
  cursor = cursor + 1
  local id = string.format('%d', cursor) .. '-0'
  redis.call('XADD', P .. 'log', 'MAXLEN', log_limit, id,
    'w', worker, 's', table.concat(new, ','), 'r', table.concat(removed, ','),
    'g', table.concat(gone, ','), 'd', cleared and '1' or '0')
  redis.call('HSET', META, 'cur', string.format('%d', cursor))
end
return cursor
""",
)

MATCH = LuaScript(
    "match",
    _HELPERS
    + r"""
-- Per worker, the leading blocks of a chain it holds: the same walk as
-- PrefixTrie.matched_blocks. The workers still matching are the holders of
-- every block so far; that set only shrinks, and is intersected only where the
-- holder string changes (consecutive blocks usually have the same holders).
-- KEYS[1] = prefix .. 'meta'; ARGV = prefix, keys (comma-separated).
-- Returns 'worker,depth,worker,depth,...': one string, because redis-py's
-- pure-Python parser costs more per array element than the walk does per block.
local HOLD = ARGV[1] .. 'holders'
local keys = split(ARGV[2])
local out = {}
local alive = nil       -- worker -> true: holders of every block so far
local run = nil         -- the holder string last compared
local n = 0
local i = 1
local done = false
while i <= #keys and not done do
  local j = math.min(i + CHUNK - 1, #keys)
  local hold = redis.call('HMGET', HOLD, unpack(keys, i, j))
  for m = 1, j - i + 1 do
    local h = hold[m]
    if not h then done = true; break end
    if h ~= run then
      local any = false
      if alive == nil then
        alive = {}
        for w in string.gmatch(h, '[^,]+') do alive[w] = true; any = true end
      else
        local hs = {}
        for w in string.gmatch(h, '[^,]+') do hs[w] = true end
        for w in pairs(alive) do
          if hs[w] then
            any = true
          else
            -- Drops out here: it held the n blocks before this one.
            if n > 0 then out[#out + 1] = w; out[#out + 1] = n end
            alive[w] = nil
          end
        end
      end
      if not any then alive = nil; done = true; break end
      run = h
    end
    n = n + 1
  end
  i = j + 1
end
if alive ~= nil and n > 0 then
  for w in pairs(alive) do out[#out + 1] = w; out[#out + 1] = n end
end
return table.concat(out, ',')
""",
)

PATH = LuaScript(
    "path",
    _HELPERS
    + r"""
-- The blocks of the longest prefix of a chain in the index, root first.
-- KEYS[1] = prefix .. 'meta'; ARGV = prefix, keys (comma-separated).
-- Returns {'depth,generation,children[,parent]', holders, ...} per block.
local BLK, HOLD = ARGV[1] .. 'blocks', ARGV[1] .. 'holders'
local keys = split(ARGV[2])
local out = {}
local i = 1
while i <= #keys do
  local j = math.min(i + CHUNK - 1, #keys)
  local meta = redis.call('HMGET', BLK, unpack(keys, i, j))
  local hold = redis.call('HMGET', HOLD, unpack(keys, i, j))
  for m = 1, j - i + 1 do
    if not meta[m] then return out end
    out[#out + 1] = meta[m]; out[#out + 1] = hold[m] or ''
  end
  i = j + 1
end
return out
""",
)
CHANGES = LuaScript(
    "changes",
    r"""
-- The change log after a cursor, read consistently with the cursor itself.
-- KEYS[1] = prefix .. 'meta'; ARGV = prefix, since.
-- Returns {cursor, incarnation or '', reaches (1|0), entries}; reaches = 0
-- when the stream was trimmed past `since` (the follower must resynchronise).
local P = ARGV[1]
local since = tonumber(ARGV[2])
local m = redis.call('HMGET', KEYS[1], 'cur', 'inc')
local cursor = tonumber(m[1] or '0')
local inc = m[2] or ''
if since >= cursor then return {cursor, inc, 1, {}} end
local base = cursor
local first = redis.call('XRANGE', P .. 'log', '-', '+', 'COUNT', 1)
if #first > 0 then base = tonumber(string.match(first[1][1], '^(%d+)')) - 1 end
if since < base then return {cursor, inc, 0, {}} end
return {cursor, inc, 1, redis.call('XRANGE', P .. 'log', string.format('%d', since + 1), '+')}
""",
)

LOADBOARD = LuaScript(
    "loadboard",
    r"""
-- The replicas' outstanding work per worker. Expiry runs on the server's
-- clock (TIME), so replicas with skewed clocks still agree on who is alive.
-- KEYS[1] = prefix .. 'load:replicas' (sorted set: replica -> expiry, ms)
-- ARGV = prefix, mode ('pub' | 'read' | 'both'), replica, ttl_ms, worker, seconds, ...
-- Returns, for 'read' and 'both', {worker, seconds, ...} summed over the
-- other live replicas.
local Z = KEYS[1]
local P = ARGV[1]
local mode = ARGV[2]
local me = ARGV[3]
local ttl = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', Z, '-inf', now)
if mode ~= 'read' then
  local h = P .. 'load:r:' .. me
  redis.call('DEL', h)
  if #ARGV > 4 then
    redis.call('HSET', h, unpack(ARGV, 5))
    redis.call('PEXPIRE', h, ttl)
  end
  redis.call('ZADD', Z, now + ttl, me)
  -- The set outlives its longest-lived member, and vanishes once all are gone.
  if redis.call('PTTL', Z) < ttl then redis.call('PEXPIRE', Z, ttl) end
end
if mode == 'pub' then return {} end
local sums, order = {}, {}
for _, r in ipairs(redis.call('ZRANGEBYSCORE', Z, '(' .. now, '+inf')) do
  if r ~= me then
    local f = redis.call('HGETALL', P .. 'load:r:' .. r)
    for i = 1, #f, 2 do
      local w, v = f[i], tonumber(f[i + 1])
      if sums[w] == nil then order[#order + 1] = w; sums[w] = v else sums[w] = sums[w] + v end
    end
  end
end
local out = {}
for _, w in ipairs(order) do out[#out + 1] = w; out[#out + 1] = string.format('%.17g', sums[w]) end
return out
""",
)
