"""The page's one stylesheet and one script (inlined; allowed by CSP hashes).

The script only adds search, expand/collapse and print-expansion on top of a page that
reads completely without it. It never reads data into code: it filters DOM text.
"""

from __future__ import annotations

import base64
import hashlib

CSS = """
:root{--fg:#111827;--muted:#6b7280;--line:#e5e7eb;--bg:#f8fafc;--card:#fff;--accent:#2563eb;
--ok:#047857;--okbg:#ecfdf5;--bad:#b91c1c;--badbg:#fef2f2;--warn:#b45309;--warnbg:#fffbeb;
--mono:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace}
*{box-sizing:border-box}
html{scroll-behavior:smooth}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);background:var(--bg)}
a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
header.top{background:#0f172a;color:#f8fafc;padding:18px 28px}
header.top h1{margin:0;font-size:20px;font-weight:650;letter-spacing:.2px}
header.top .sub{color:#cbd5e1;font-size:12.5px;margin-top:2px;word-break:break-all}
.layout{display:grid;grid-template-columns:210px minmax(0,1fr);gap:28px;max-width:1320px;margin:0 auto;padding:22px 28px 60px}
nav.toc{position:sticky;top:16px;align-self:start;font-size:13px;max-height:calc(100vh - 32px);overflow:auto}
nav.toc ol{list-style:none;margin:0;padding:0}nav.toc li{margin:1px 0}
nav.toc a{display:flex;justify-content:space-between;gap:8px;padding:3px 8px;border-radius:5px;color:#334155}
nav.toc a:hover{background:#e2e8f0;text-decoration:none}
nav.toc .n{color:#b91c1c;font-size:12px;font-variant-numeric:tabular-nums;align-self:center}
nav.toc .sec{margin-top:10px;font-size:11px;text-transform:uppercase;letter-spacing:.06em;color:var(--muted);padding:0 8px}
main{min-width:0}
section.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:20px 24px;margin:0 0 20px;scroll-margin-top:12px}
section.card>h2{margin:0 0 4px;font-size:18px}
h2 .tag,h3 .tag{font-size:11.5px;font-weight:500;color:var(--muted);margin-left:8px;font-family:var(--mono)}
h3{font-size:15px;margin:22px 0 8px}
p.lead{color:var(--muted);margin:0 0 14px}
.verdict{display:flex;align-items:center;gap:18px;border-radius:10px;padding:16px 22px;margin:0 0 18px;border:1px solid}
.verdict.ok{background:var(--okbg);border-color:#a7f3d0;color:var(--ok)}
.verdict.bad{background:var(--badbg);border-color:#fecaca;color:var(--bad)}
.verdict.unknown{background:var(--warnbg);border-color:#fde68a;color:var(--warn)}
.verdict .big{font-size:30px;font-weight:800;letter-spacing:.5px;line-height:1.1}
.verdict .eq{font-size:15px;color:var(--fg);font-variant-numeric:tabular-nums}
.verdict .icon{font-size:38px;font-weight:800}
.kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(112px,1fr));gap:10px;margin:0 0 18px}
.kpi{border:1px solid var(--line);border-radius:8px;padding:10px 14px;background:#fcfdff}
.kpi .v{font-size:21px;white-space:nowrap;font-weight:700;font-variant-numeric:tabular-nums}
.kpi .k{font-size:12px;color:var(--muted)}
.kpi.kept .v{color:var(--accent)}.kpi.rej .v{color:#dc2626}
ul.checks{list-style:none;padding:0;margin:0 0 10px;columns:2;column-gap:28px}
ul.checks li{break-inside:avoid;padding:2px 0}
.ck{display:inline-block;width:18px;font-weight:800}.ck.ok{color:var(--ok)}.ck.bad{color:var(--bad)}.ck.na{color:var(--warn)}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
td{overflow-wrap:break-word}
td.txt{min-width:220px}
th{font-weight:600;color:#374151;background:#f8fafc;position:sticky;top:0}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.mono,.mono{font-family:var(--mono);font-size:12px;word-break:break-all}
.scroll{max-height:460px;overflow:auto;border:1px solid var(--line);border-radius:6px}
.scroll table th{box-shadow:0 1px 0 var(--line)}
.xscroll{overflow-x:auto}
pre{font-family:var(--mono);font-size:12px;background:#f8fafc;border:1px solid var(--line);border-radius:6px;padding:10px 12px;overflow:auto;white-space:pre-wrap;word-break:break-word;margin:6px 0;max-height:420px}
code{font-family:var(--mono);font-size:12px;background:#f1f5f9;border-radius:4px;padding:0 4px}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:18px}
.stat-grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:8px 14px;margin:8px 0 6px}
.stat{border-left:3px solid #cbd5e1;padding:2px 10px}
.stat .k{font-size:12px;color:var(--muted)}.stat .v{font-weight:650;font-variant-numeric:tabular-nums;word-break:break-word}
.block{margin:18px 0 0}
.block>h3{margin:0 0 8px}
svg.chart{max-width:100%;height:auto;display:block}
svg.meter{vertical-align:middle}
details>summary{cursor:pointer}
details.data>summary{font-size:12px;color:var(--muted);margin-top:4px}
.badge{display:inline-block;border-radius:999px;padding:0 8px;font-size:12px;font-weight:600;background:#eef2ff;color:#3730a3;white-space:nowrap}
.badge.stable,.badge.ok,.badge.pass{background:var(--okbg);color:var(--ok)}
.badge.moderate,.badge.warn,.badge.flag{background:var(--warnbg);color:var(--warn)}
.badge.major,.badge.bad,.badge.fail,.badge.drop,.badge.reject{background:var(--badbg);color:var(--bad)}
.stagehead{display:flex;flex-wrap:wrap;gap:6px 18px;font-size:13px;color:var(--muted);margin:4px 0 8px}
.stagehead b{color:var(--fg);font-variant-numeric:tabular-nums}
.reasons-inline{margin:6px 0 0;font-size:13px}
.reasons-inline code{margin-right:4px}
.toolbar{display:flex;gap:8px;align-items:center;margin:0 0 12px;flex-wrap:wrap}
.toolbar input{flex:1;min-width:220px;font:inherit;padding:7px 10px;border:1px solid #cbd5e1;border-radius:6px}
.toolbar button{font:inherit;font-size:13px;padding:6px 10px;border:1px solid #cbd5e1;background:#fff;border-radius:6px;cursor:pointer}
.toolbar button:hover{background:#f1f5f9}
.toolbar .count{color:var(--muted);font-size:13px}
details.reason{border:1px solid var(--line);border-radius:8px;margin:0 0 8px;background:#fff}
details.reason>summary{padding:9px 12px;display:flex;gap:12px;align-items:center;flex-wrap:wrap;list-style:none}
details.reason>summary::-webkit-details-marker{display:none}
details.reason>summary::before{content:"▸";color:var(--muted);width:10px}
details.reason[open]>summary::before{content:"▾"}
details.reason>summary .rc{font-family:var(--mono);font-weight:650}
details.reason>summary .cnt{margin-left:auto;font-variant-numeric:tabular-nums;font-weight:650}
details.reason>summary .share{color:var(--muted);font-size:12px;min-width:52px;text-align:right}
details.reason .body{padding:0 12px 10px}
.example-detail{color:var(--muted);font-size:12.5px;margin:0 0 8px}
details.sample{border-top:1px solid var(--line);padding:6px 0}
details.sample>summary{display:flex;gap:10px;align-items:baseline;font-size:13px}
details.sample>summary .sid{font-family:var(--mono);font-size:12px;color:#334155;white-space:nowrap}
details.sample>summary .sdet{color:#92400e;font-size:12px;white-space:nowrap;max-width:38%;overflow:hidden;text-overflow:ellipsis}
details.sample>summary .snip{color:#475569;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;flex:1;min-width:0}
details.sample .rec{margin:8px 0 4px 16px}
.det{font-size:12.5px;color:#92400e;background:#fffbeb;border-radius:4px;padding:2px 6px;display:inline-block;margin:0 0 6px}
.msg{border:1px solid var(--line);border-radius:8px;margin:6px 0;overflow:hidden}
.msg .role{font-size:11px;font-weight:700;text-transform:uppercase;letter-spacing:.06em;padding:3px 10px;border-bottom:1px solid var(--line)}
.msg .content{padding:8px 10px;white-space:pre-wrap;word-break:break-word;font-size:13px}
.msg.system .role{background:#f1f5f9;color:#475569}.msg.user .role{background:#eff6ff;color:#1d4ed8}
.msg.assistant .role{background:#ecfdf5;color:#047857}.msg.tool .role{background:#fffbeb;color:#b45309}
.msg.other .role{background:#faf5ff;color:#7e22ce}
.cut{color:var(--muted);font-style:italic}
.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;font-size:12.5px;margin:6px 0}
.kv.wide{grid-template-columns:repeat(3,max-content minmax(60px,1fr))}
.kv .k{color:var(--muted);font-family:var(--mono)}.kv .hot{color:#b91c1c;font-weight:700}.kv .v{font-family:var(--mono);word-break:break-word}
.ex{border:1px solid var(--line);border-radius:8px;padding:10px 12px;margin:0 0 10px}
.ex .exhead{font-size:12.5px;color:var(--muted);margin:0 0 6px;display:flex;gap:12px;flex-wrap:wrap}
.ex .exhead .mono{color:#334155}
.ex .pane h4{margin:0 0 4px;font-size:11.5px;text-transform:uppercase;letter-spacing:.06em;color:var(--muted)}
.ex .txt{white-space:pre-wrap;word-break:break-word;font-size:13px;background:#fafafa;border-radius:6px;padding:8px 10px;max-height:320px;overflow:auto}
mark{background:#fde68a;color:inherit;border-radius:2px;padding:0 1px;box-shadow:0 0 0 1px #f59e0b inset}
.ex .note{font-size:12.5px;margin-top:6px}
details.more>summary{font-size:13px;color:var(--accent);margin:0 0 10px}
.textblock{white-space:pre-wrap}
table.heat{width:auto;border-collapse:separate;border-spacing:1px;font-size:11px}
table.heat th{background:none;font-weight:500;color:#4b5563;white-space:nowrap;padding:2px 5px;position:static}
table.heat th.ct{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;vertical-align:bottom;max-height:150px;overflow:hidden}
table.heat td{text-align:center;padding:3px 4px;min-width:34px;border:none;font-variant-numeric:tabular-nums}
table.heat.dense td{min-width:12px;padding:1px;font-size:0;height:12px}
.axis-note{font-size:12px;color:var(--muted)}
.h0{background:#f8fafc}.h1{background:#fee2e2}.h2{background:#fecaca}.h3{background:#fca5a5}.h4{background:#f87171}
.h5{background:#ef4444;color:#fff}.h6{background:#dc2626;color:#fff}.h7{background:#b91c1c;color:#fff}.h8{background:#991b1b;color:#fff}.h9{background:#7f1d1d;color:#fff}
.d0{background:#f0fdf4}.d1{background:#dcfce7}.d2{background:#bbf7d0}.d3{background:#86efac}.d4{background:#4ade80}
.d5{background:#22c55e;color:#fff}.d6{background:#16a34a;color:#fff}.d7{background:#15803d;color:#fff}.d8{background:#166534;color:#fff}.d9{background:#14532d;color:#fff}
.b0{background:#f8fafc}.b1{background:#dbeafe}.b2{background:#bfdbfe}.b3{background:#93c5fd}.b4{background:#60a5fa}
.b5{background:#3b82f6;color:#fff}.b6{background:#2563eb;color:#fff}.b7{background:#1d4ed8;color:#fff}.b8{background:#1e40af;color:#fff}.b9{background:#1e3a8a;color:#fff}
.muted{color:var(--muted)}.small{font-size:12px}
footer{color:var(--muted);font-size:12px;text-align:center;margin:30px 0 0}
[hidden]{display:none!important}
@media (max-width:900px){.kv.wide{grid-template-columns:max-content 1fr}.layout{grid-template-columns:1fr}nav.toc{position:static;max-height:none}.grid2{grid-template-columns:1fr}ul.checks{columns:1}}
@media print{
 body{background:#fff;font-size:11.5px}header.top{background:#fff;color:#000;border-bottom:2px solid #000;padding:8px 0}
 header.top .sub{color:#333}.layout{display:block;padding:0;max-width:none}nav.toc,.toolbar{display:none}
 section.card{border:none;border-top:1px solid #ccc;border-radius:0;padding:12px 0;break-inside:auto}
 .scroll,pre,.ex .txt{max-height:none;overflow:visible}th{position:static}
 .block,.ex,details.sample,svg.chart{break-inside:avoid}
 .h5,.h6,.h7,.h8,.h9,.d5,.d6,.d7,.d8,.d9,.b5,.b6,.b7,.b8,.b9,.h1,.h2,.h3,.h4,.d1,.d2,.d3,.d4,.b1,.b2,.b3,.b4{print-color-adjust:exact;-webkit-print-color-adjust:exact}
 .verdict,svg{print-color-adjust:exact;-webkit-print-color-adjust:exact}
}
""".strip()

JS = """
(function(){
  "use strict";
  var box=document.getElementById("sample-search");
  var bar=document.getElementById("sample-toolbar");
  if(bar){bar.hidden=false;}
  var groups=[].slice.call(document.querySelectorAll("details.reason"));
  var count=document.getElementById("sample-count");
  function apply(){
    var q=(box&&box.value||"").trim().toLowerCase();var shown=0;var total=0;
    groups.forEach(function(g){
      var rows=[].slice.call(g.querySelectorAll("details.sample"));var hits=0;
      var head=(g.querySelector("summary").textContent||"").toLowerCase();
      rows.forEach(function(r){total++;var ok=!q||head.indexOf(q)>=0||r.textContent.toLowerCase().indexOf(q)>=0;
        r.hidden=!ok;if(ok){hits++;}});
      shown+=hits;g.hidden=!!q&&hits===0&&head.indexOf(q)<0;
      if(q){g.open=hits>0;}
    });
    if(count){count.textContent=q?(shown+" of "+total+" sample rows match"):(total+" sample rows");}
  }
  if(box){box.addEventListener("input",apply);apply();}
  function setAll(open){groups.forEach(function(g){g.open=open;
    [].slice.call(g.querySelectorAll("details.sample")).forEach(function(r){r.open=open;});});}
  var ex=document.getElementById("expand-all"),co=document.getElementById("collapse-all");
  if(ex){ex.addEventListener("click",function(){setAll(true);});}
  if(co){co.addEventListener("click",function(){setAll(false);});}
  var closed=[];
  window.addEventListener("beforeprint",function(){closed=[].slice.call(document.querySelectorAll("details:not([open])"));
    closed.forEach(function(d){d.open=true;});});
  window.addEventListener("afterprint",function(){closed.forEach(function(d){d.open=false;});closed=[];});
})();
""".strip()


def csp_hash(text: str) -> str:
    """The CSP source expression that allows exactly this inline <style>/<script> body."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy() -> str:
    """No network at all: inline style/script allowed by hash only, images only from data: URLs."""
    return ("default-src 'none'; "
            f"style-src {csp_hash(CSS)}; script-src {csp_hash(JS)}; img-src data:; "
            "base-uri 'none'; form-action 'none'")
