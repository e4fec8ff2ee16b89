-- miltertest script for the filter of tests/miltertest_every_modification.rs,
-- which answers every stage and makes every end-of-message modification:
--
--   miltertest -D socket=inet:PORT@127.0.0.1 -s every_modification.lua
--   miltertest -D socket=unix:PATH -s every_modification.lua
--
-- Each check is named after the filter's mechanism it tests (the Rust
-- test turns each off in turn and expects the check of that name to
-- fail). A failed check prints `check failed: NAME ...` and raises an
-- error, so miltertest exits non-zero.
--
-- What miltertest 2.11 cannot check, every_modification.py does: the
-- changed envelope sender (SMFIR_CHGFROM) and a recipient added with ESMTP
-- arguments (SMFIR_ADDRCPT_PAR) have no MT_* check, miltertest reads each
-- reply into a 1 KiB buffer (so body chunks here stay small), and it keeps
-- a reply code's text only at end of message.

local checks = 0

local function check(ok, what)
  checks = checks + 1
  if ok then
    return
  end
  mt.echo("check failed: " .. what .. " (check " .. checks .. ")")
  error("check failed: " .. what)
end

local function sent(err, what)
  check(err == nil, what .. ": " .. tostring(err))
end

local function name(code)
  if code == nil or code == 0 then
    return "none"
  end
  return string.char(code)
end

-- The reply to the last command must be `want`.
local function replied(conn, want, what)
  local got = mt.getreply(conn)
  check(got == want, what .. ": reply '" .. name(got) .. "', want '" .. name(want) .. "'")
end

local conn = mt.connect(socket, 10, 0.1)
check(conn ~= nil, "connect to the filter at " .. socket)

-- Sent a command (`err` is what mt.* returned) answered with `want`.
local function step(what, want, err)
  sent(err, what)
  replied(conn, want, what)
end

-- Negotiation: every modification, every stage answered, skip allowed.
sent(mt.negotiate(conn, nil, nil, nil), "negotiate")
for _, action in ipairs({ SMFIF_ADDHDRS, SMFIF_CHGHDRS, SMFIF_CHGBODY, SMFIF_ADDRCPT,
  SMFIF_ADDRCPT_PAR, SMFIF_DELRCPT, SMFIF_QUARANTINE, SMFIF_CHGFROM }) do
  check(mt.test_action(conn, action), "negotiate: action " .. string.format("0x%x", action))
end
for _, option in ipairs({ SMFIP_NOCONNECT, SMFIP_NOHELO, SMFIP_NOMAIL, SMFIP_NORCPT,
  SMFIP_NOBODY, SMFIP_NOHDRS, SMFIP_NOEOH, SMFIP_NOUNKNOWN, SMFIP_NODATA,
  SMFIP_NR_HDR, SMFIP_NR_CONN, SMFIP_NR_HELO, SMFIP_NR_MAIL, SMFIP_NR_RCPT,
  SMFIP_NR_DATA, SMFIP_NR_UNKN, SMFIP_NR_EOH, SMFIP_NR_BODY }) do
  check(not mt.test_option(conn, option), "negotiate: every stage sent and answered " .. string.format("0x%x", option))
end
check(mt.test_option(conn, SMFIP_SKIP), "negotiate: SMFIP_SKIP")

-- Macros of stages miltertest has no constant for.
local DATA, EOH, EOM = string.byte("T"), string.byte("N"), string.byte("E")

-- The connection's stages, each with its macro.
mt.macro(conn, SMFIC_CONNECT, "j", "mx.forkpool.test")
step("connect", SMFIR_CONTINUE, mt.conninfo(conn, "client.forkpool.test", "127.0.0.1"))
mt.macro(conn, SMFIC_HELO, "{tls_version}", "TLSv1.3")
step("helo", SMFIR_CONTINUE, mt.helo(conn, "client.forkpool.test"))
step("unknown-reject", SMFIR_REJECT, mt.unknown(conn, "XYZZY"))

local function mail(sender, id, want, what)
  mt.macro(conn, SMFIC_MAIL, "i", id)
  sent(mt.mailfrom(conn, sender, "BODY=8BITMIME"), what)
  replied(conn, want, what)
end

local function rcpt(recipient, want, what)
  mt.macro(conn, SMFIC_RCPT, "{rcpt_addr}", string.match(recipient, "^<(.*)>$"))
  sent(mt.rcptto(conn, recipient), what)
  replied(conn, want, what)
end

local function headers(list)
  for _, h in ipairs(list) do
    step("header " .. h[1], SMFIR_CONTINUE, mt.header(conn, h[1], h[2]))
  end
end

-- End of headers, a body chunk (answered with `body_reply`; the skip
-- check is named body-skip), end of message; the EOH and EOM macros when
-- given.
local function finish(eoh_macro, body_reply, eom_macro, what)
  if eoh_macro then
    mt.macro(conn, EOH, "{mt_eoh}", eoh_macro)
  end
  step("eoh " .. what, SMFIR_CONTINUE, mt.eoh(conn))
  local body = body_reply == SMFIR_SKIP and "body-skip" or "body"
  step(body .. " " .. what, body_reply, mt.bodystring(conn, "old body\r\n"))
  mt.macro(conn, EOM, "{mt_eom}", eom_macro)
  step("eom " .. what, SMFIR_CONTINUE, mt.eom(conn))
end

-- The filter echoes, in X-Macros, the macro each stage saw (`-` if none):
-- the connection's, then the message's.
local function macros_seen(message, what)
  local want = "connect=mx.forkpool.test helo=TLSv1.3 " .. message
  check(mt.eom_check(conn, MT_HDRADD, "X-Macros", want),
    "macros: " .. what .. ": got " .. tostring(mt.getheader(conn, "X-Macros", 0)))
end

local function abort(what)
  sent(mt.abort(conn), "abort after " .. what)
end

-- Statuses at MAIL, RCPT and DATA, each message aborted after it.
mail("<tempfail@forkpool.test>", "MSG-A", SMFIR_TEMPFAIL, "mail-tempfail")
abort("mail-tempfail")
mail("<reject@forkpool.test>", "MSG-B", SMFIR_REJECT, "mail-reject")
abort("mail-reject")
mail("<sender@forkpool.test>", "MSG-C", SMFIR_CONTINUE, "mail")
rcpt("<reply@forkpool.test>", SMFIR_REPLYCODE, "rcpt-reply")
rcpt("<discard@forkpool.test>", SMFIR_DISCARD, "rcpt-discard")
abort("rcpt-discard")
mail("<sender@forkpool.test>", "MSG-D", SMFIR_CONTINUE, "mail")
rcpt("<accept@forkpool.test>", SMFIR_ACCEPT, "rcpt-accept")
abort("rcpt-accept")
mail("<sender@forkpool.test>", "MSG-E", SMFIR_CONTINUE, "mail")
rcpt("<data-tempfail@forkpool.test>", SMFIR_CONTINUE, "rcpt")
step("data-tempfail", SMFIR_TEMPFAIL, mt.data(conn))
abort("data-tempfail")

-- A whole message, every stage with its macro, to every@: every
-- modification.
mail("<sender@forkpool.test>", "MSG-F", SMFIR_CONTINUE, "mail")
rcpt("<every@forkpool.test>", SMFIR_CONTINUE, "rcpt every@")
rcpt("<gone@forkpool.test>", SMFIR_CONTINUE, "rcpt gone@")
mt.macro(conn, DATA, "{mt_data}", "d-F")
step("data", SMFIR_CONTINUE, mt.data(conn))
headers({ { "From", "<sender@forkpool.test>" }, { "Subject", "original" }, { "X-Remove", "me" } })
finish("e-F", SMFIR_CONTINUE, "m-F", "every@")

macros_seen("mail=MSG-F rcpt=every@forkpool.test rcpt=gone@forkpool.test data=d-F eoh=e-F eom=m-F",
  "each stage saw its own")
check(mt.eom_check(conn, MT_HDRADD, "X-Added", "added"), "add-header")
check(mt.eom_check(conn, MT_HDRINSERT, "X-Inserted", "inserted", 1), "insert-header at 1")
check(mt.eom_check(conn, MT_HDRCHANGE, "Subject", "changed"), "change-header Subject")
check(mt.eom_check(conn, MT_HDRDELETE, "X-Remove", 1), "delete-header X-Remove")
check(mt.eom_check(conn, MT_RCPTADD, "<added@forkpool.test>"), "add-rcpt")
-- Sent as SMFIR_ADDRCPT_PAR, which MT_RCPTADD does not match.
check(not mt.eom_check(conn, MT_RCPTADD, "<added-par@forkpool.test>"),
  "add-rcpt with ESMTP arguments is not a plain SMFIR_ADDRCPT")
check(mt.eom_check(conn, MT_RCPTDELETE, "<gone@forkpool.test>"), "delete-rcpt")
check(mt.eom_check(conn, MT_BODYCHANGE, "new body, part one\r\n"), "replace-body chunk 1")
check(mt.eom_check(conn, MT_BODYCHANGE, "part two\r\n"), "replace-body chunk 2")
check(mt.eom_check(conn, MT_QUARANTINE, "held for review"), "quarantine")
check(not mt.eom_check(conn, MT_SMTPREPLY, "451-4.7.1 first line\r\n451", "4.7.1",
  "second line"), "eom every@ has no reply text")

-- A message aborted after its DATA and EOH macros...
mail("<sender@forkpool.test>", "MSG-G", SMFIR_CONTINUE, "mail")
rcpt("<plain@forkpool.test>", SMFIR_CONTINUE, "rcpt")
mt.macro(conn, DATA, "{mt_data}", "d-G")
step("data", SMFIR_CONTINUE, mt.data(conn))
headers({ { "Subject", "aborted" } })
mt.macro(conn, EOH, "{mt_eoh}", "e-G")
step("eoh", SMFIR_CONTINUE, mt.eoh(conn))
abort("a message in its headers")

-- ...and a new one on the same connection: the aborted message's macros
-- are gone, the body is skipped, nothing is modified.
mail("<sender@forkpool.test>", "MSG-H", SMFIR_CONTINUE, "mail after abort")
rcpt("<plain@forkpool.test>", SMFIR_CONTINUE, "rcpt after abort")
step("data after abort", SMFIR_CONTINUE, mt.data(conn))
headers({ { "X-Skip-Body", "yes" } })
finish(nil, SMFIR_SKIP, "m-H", "after abort")
macros_seen("mail=MSG-H rcpt=plain@forkpool.test data=- eoh=- eom=m-H",
  "the aborted message's are forgotten")
for _, op in ipairs({ MT_HDRINSERT, MT_HDRCHANGE, MT_HDRDELETE, MT_BODYCHANGE, MT_QUARANTINE }) do
  check(not mt.eom_check(conn, op), "a plain message is not modified (" .. op .. ")")
end
check(not mt.eom_check(conn, MT_HDRADD, "X-Added"), "a plain message gets no X-Added")
check(not mt.eom_check(conn, MT_RCPTADD, "<added@forkpool.test>"), "a plain message: no rcpt added")

-- Each final status at end of message.
local finals = {
  { "eom-accept", SMFIR_ACCEPT },
  { "eom-discard", SMFIR_DISCARD },
  { "eom-reject", SMFIR_REJECT },
  { "eom-tempfail", SMFIR_TEMPFAIL },
  { "eom-reply", SMFIR_REPLYCODE },
}
for i, final in ipairs(finals) do
  mail("<sender@forkpool.test>", "MSG-EOM-" .. i, SMFIR_CONTINUE, "mail")
  rcpt("<" .. final[1] .. "@forkpool.test>", SMFIR_CONTINUE, "rcpt")
  step("body", SMFIR_CONTINUE, mt.bodystring(conn, "text\r\n"))
  step(final[1], final[2], mt.eom(conn))
end
-- The last one's text: two lines, the first continued with a dash.
check(mt.eom_check(conn, MT_SMTPREPLY, "451-4.7.1 first line\r\n451", "4.7.1", "second line"),
  "eom-reply text")

sent(mt.disconnect(conn), "quit")
mt.echo("every check passed (" .. checks .. " checks)")
