"""Lua scripts of the run's lifecycle (BeginRun, CommitStep, PublishVersion) and of the accounting check; the rules
and the KEYS binding are those of scripts.py (PRELUDE), whose other scripts move single groups."""

# ARGV: resume_step, weight_version. Returns {epoch, returned, retargeted, committed, requeued}.
BEGIN_RUN = """
local r, w = tonumber(ARGV[1]), tonumber(ARGV[2])
local epoch = redis.call('HINCRBY', K_RUN, 'epoch', 1)
redis.call('HSET', K_RUN, 'floor', r, 'step', r, 'version', w, 'resume_version', w)
local returned, committed, requeued, retargeted = 0, 0, 0, 0
-- Steps < r are in the checkpoint the trainer resumed from (committed); steps >= r were trained by a trainer that
-- died before checkpointing them: they go back to the store, to be trained exactly once.
for _, e in ipairs(redis.call('XRANGE', K_TRAINED, '-', '+')) do
  local f = fields(e[2])
  redis.call('XDEL', K_TRAINED, e[1])
  if tonumber(f.step) < r then
    local t = entry(K_TRAJ, f.tid)
    if t then redis.call('DEL', t.pk) end
    redis.call('XDEL', K_TRAJ, f.tid)
    committed = committed + 1
  else
    local t = entry(K_TRAJ, f.tid)
    if t then
      redis.call('ZADD', K_READY, t.minv, f.tid)
      redis.call('HSET', K_STATUS, f.gid, 'scored')
      returned = returned + 1
    end
  end
end
-- Scored groups with tokens newer than the resumed weights came from a timeline that no longer exists: their
-- prompts are leased again (from the prompt bytes kept with the header; the scored bytes go).
for _, zkey in ipairs({K_READY, K_READY_VAL}) do
  for _, tid in ipairs(redis.call('ZRANGE', zkey, 0, -1)) do
    local f = entry(K_TRAJ, tid)
    if f and tonumber(f.maxv) > w then
      redis.call('XADD', K_PROMPTS, '*', 'gid', f.gid, 'target', f.target, 'val', f.val, 'kind', f.pkind,
                 'data', f.prompt)
      redis.call('DEL', f.pk)
      redis.call('ZREM', zkey, tid)
      redis.call('XDEL', K_TRAJ, tid)
      redis.call('HSET', K_STATUS, f.gid, 'enqueued')
      requeued = requeued + 1
    end
  end
end
for _, e in ipairs(redis.call('XRANGE', K_PROMPTS, '-', '+')) do
  if tonumber(fields(e[2]).target) < r then retargeted = retargeted + 1 end
end
incr('sampled', -returned)
incr('returned_on_resume', returned)
incr('committed', committed)
incr('requeued', requeued)
if committed > 0 and r - 1 > run_int('committed_step') then redis.call('HSET', K_RUN, 'committed_step', r - 1) end
return {epoch, returned, retargeted, committed, requeued}
"""

# ARGV: step, epoch. Returns committed count, or -1 on an epoch mismatch.
COMMIT = """
if tonumber(ARGV[2]) ~= run_int('epoch') then return -1 end
local s = tonumber(ARGV[1])
local trained, tids, pks = {}, {}, {}
for _, e in ipairs(redis.call('XRANGE', K_TRAINED, '-', '+')) do
  local f = fields(e[2])
  if tonumber(f.step) <= s then
    -- A trained entry names its payload key; one written by an older buffer does not: read it off the traj entry.
    local pk = f.pk
    if not pk then
      local t = entry(K_TRAJ, f.tid)
      if t then pk = t.pk end
    end
    if pk then pks[#pks + 1] = pk end
    tids[#tids + 1] = f.tid
    trained[#trained + 1] = e[1]
  end
end
-- One command each for the whole step, not three per group.
many('DEL', nil, pks)
many('XDEL', K_TRAJ, tids)
many('XDEL', K_TRAINED, trained)
incr('committed', #trained)
if s > run_int('committed_step') then redis.call('HSET', K_RUN, 'committed_step', s) end
return #trained
"""

# ARGV: version, epoch, step. Returns the current epoch (the caller compares).
PUBLISH = """
local epoch = run_int('epoch')
if tonumber(ARGV[2]) == epoch then redis.call('HSET', K_RUN, 'version', ARGV[1], 'step', ARGV[3]) end
return epoch
"""

# ARGV: group, pool. Returns {state counts..., structure sizes...} as a flat name/value list.
ACCOUNTING = """
local c = {enqueued = 0, leased = 0, scored = 0, sampled = 0, dead = 0, other = 0}
local flat = redis.call('HGETALL', K_STATUS)
for i = 2, #flat, 2 do
  local s = flat[i]
  local k = string.match(s, '^(%a+)')
  if c[k] == nil then k = 'other' end
  c[k] = c[k] + 1
end
local pel, pool = 0, 0
local summary = redis.call('XPENDING', K_PROMPTS, ARGV[1])
pel = summary[1]
for _, row in ipairs(summary[4] or {}) do
  if row[1] == ARGV[2] then pool = tonumber(row[2]) end
end
local out = {}
for k, v in pairs(c) do out[#out + 1] = 'state:' .. k; out[#out + 1] = v end
local sizes = {
  prompts = redis.call('XLEN', K_PROMPTS), pel = pel, pool = pool, ready = redis.call('ZCARD', K_READY),
  ready_val = redis.call('ZCARD', K_READY_VAL), traj = redis.call('XLEN', K_TRAJ),
  trained = redis.call('XLEN', K_TRAINED), dead = redis.call('XLEN', K_DEAD),
  c_enqueued = tonumber(redis.call('HGET', K_COUNTERS, 'enqueued') or '0'),
  c_sampled = tonumber(redis.call('HGET', K_COUNTERS, 'sampled') or '0'),
  c_dead = tonumber(redis.call('HGET', K_COUNTERS, 'dead_lettered') or '0'),
}
for k, v in pairs(sizes) do out[#out + 1] = k; out[#out + 1] = v end
return out
"""
