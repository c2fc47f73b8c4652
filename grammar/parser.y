/* parser.y -- the .moe grammar: a pure, reentrant bison parser with locations, LAC and error
 * recovery at statement boundaries. The grammar rule is written above each action.
 *
 * Newlines end statements. The lexer (lexer.l) drops a newline inside ( ) and [ ], after a
 * token that cannot end a statement (an operator, '=', ',', '{', a keyword), and before a
 * line that starts with '{'; so expressions continue over lines naturally.
 */
%define api.pure full
%define api.prefix {moe_yy}
%define api.token.prefix {TK_}
%define api.location.type {diag_span}
%define parse.error custom
%define parse.lac full
%locations
%expect 0
%param {yyscan_t scanner}
%parse-param {parse_state *ps}

%code requires {
#include "ast.h"
#ifndef MOE_YYSCAN_T
#define MOE_YYSCAN_T
typedef void *yyscan_t;
#endif

#define PARSE_MAX_NEST 64 /* open brackets at once */

/* One open bracket, for newline handling and "expected ')' (to close '(' at line 3)". */
typedef struct {
  char ch;
  int line, col;
} parse_open;

/* State shared by the lexer and the parser (the lexer's yyextra). */
typedef struct parse_state {
  diag_engine *diag;
  diag_file *file;
  ast_arena *arena;
  int start_tok;            /* first token to hand out (START_FILE or START_EXPR), then 0 */
  int line, col;            /* position of the next byte */
  int last_tok;             /* the previous token, which decides whether a newline counts */
  parse_open open[PARSE_MAX_NEST];
  int depth;
  parse_open snap;          /* innermost open bracket before the last token (ch 0: none) */
  int snap_depth;           /* open brackets before the last token */
  int prev_line, cur_line;  /* where the token before the last one ended, and the last one */
  diag_span comment_start;  /* of an open block comment */
  int fatal;                /* nesting limit hit: the rest of the file is skipped */
  int errors;               /* syntax and lexical errors in this source */
  ast_block *items;         /* result of a file */
  ast_expr *expr;           /* result of a --set value */
} parse_state;
}

%code provides {
int moe_yylex(MOE_YYSTYPE *yylval, diag_span *yylloc, yyscan_t scanner);
/* Parses f (a .moe file, or with as_expr a --set value that is one expression). Reports
 * errors to d; returns the number of syntax errors. On success *items or *expr is set. */
int parse_source(diag_engine *d, diag_file *f, ast_arena *arena, int as_expr, ast_block **items,
                 ast_expr **expr);
/* Reports a lexical or syntax error of this source. */
void parse_error(parse_state *ps, diag_span at, const char *fmt, ...) DIAG_FMT(3, 4);
}

%code {
#include <stdarg.h>
#include <string.h>

#include "lexer.h"

#define YYMAXDEPTH 2000
#define YYLLOC_DEFAULT(Cur, Rhs, N)                 \
  do {                                              \
    if (N) {                                        \
      (Cur) = YYRHSLOC(Rhs, 1);                     \
      (Cur).end_line = YYRHSLOC(Rhs, N).end_line;   \
      (Cur).end_col = YYRHSLOC(Rhs, N).end_col;     \
    } else {                                        \
      (Cur) = YYRHSLOC(Rhs, 0);                     \
      (Cur).line = (Cur).end_line;                  \
      (Cur).col = (Cur).end_col;                    \
    }                                               \
  } while (0)

static void moe_yyerror(diag_span *loc, yyscan_t scanner, parse_state *ps, const char *msg);

void parse_error(parse_state *ps, diag_span at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ps->errors++;
  diag_verror(ps->diag, at, fmt, ap);
  va_end(ap);
}

/* Finishes an expression node: depth, and the nesting limit. */
static ast_expr *done(parse_state *ps, ast_expr *e) {
  int bad_before = e->bad;
  if (ast_depth(e) > AST_MAX_DEPTH) {
    if (!bad_before && !e->bad)
      parse_error(ps, e->span, "expression nested too deeply (more than %d levels)", AST_MAX_DEPTH);
    e->bad = 1;
    e->depth = AST_MAX_DEPTH + 1;
  }
  return e;
}

static ast_expr *binop(parse_state *ps, char op, ast_expr *a, ast_expr *b, diag_span at) {
  ast_expr *e = ast_expr_new(ps->arena, EX_BIN, at);
  e->op = op;
  e->a = a;
  e->b = b;
  return done(ps, e);
}

static ast_expr *holder(parse_state *ps, diag_span at) { return ast_expr_new(ps->arena, EX_TUPLE, at); }

static ast_stmt *stmt(parse_state *ps, ast_stmt_kind k, diag_span at) { return ast_stmt_new(ps->arena, k, at); }

static ast_block *block(parse_state *ps) { return ast_alloc(ps->arena, sizeof(ast_block)); }
}

%initial-action {
  @$ = (diag_span){ps->file, 1, 1, 1, 2};
}

%union {
  ast_expr *expr;
  ast_stmt *stmt;
  ast_block *block;
  const char *str;
  ast_arg arg;
  struct { int64_t i; double f; int bad; } lit;
}

%token START_FILE START_EXPR
%token <str> NAME "name" STRING "string"
%token <lit> INT "integer" FLOAT "number"
%token MODEL "model" TRAIN "train" REPEAT "repeat" INCLUDE "include" TRUE "true" FALSE "false"
%token NEWLINE "end of line"
%token LP "(" RP ")" LB "[" RB "]" LC "{" RC "}" COMMA "," SEMI ";" EQ "="
%token PLUS "+" MINUS "-" STAR "*" SLASH "/" PERCENT "%"

%left "+" "-"
%left "*" "/" "%"
%precedence NEG

%type <expr> expr primary count arglist args rfields rlist
%type <stmt> item stmt
%type <block> file items block stmts
%type <arg> arg field

%%

/* top: START_FILE file | START_EXPR expr */
top:
  START_FILE file       { ps->items = $2; }
| START_EXPR expr       { ps->expr = $2; }
;

/* file: items [item] */
file:
  items                 { $$ = $1; }
| items item            { $$ = $1; ast_block_push(ps->arena, $$, $2); }
;

/* items: { item sep | sep | error sep } */
items:
  %empty                { $$ = block(ps); }
| items sep             { $$ = $1; }
| items item sep        { $$ = $1; ast_block_push(ps->arena, $$, $2); }
| items error sep       { $$ = $1; yyerrok; }
;

sep: NEWLINE | ";" ;

/* item: "include" STRING */
item:
  INCLUDE STRING        { $$ = stmt(ps, ST_INCLUDE, @$); $$->name = $2; $$->name_span = @2; }
/* item: "model" NAME block */
| MODEL NAME block      { $$ = stmt(ps, ST_MODEL, @$); $$->name = $2; $$->name_span = @2; $$->body = $3; }
/* item: "train" block */
| TRAIN block           { $$ = stmt(ps, ST_TRAIN, @$); $$->name_span = @1; $$->body = $2; }
/* item: NAME "=" expr  -- a constant shared by the file */
| NAME "=" expr         { $$ = stmt(ps, ST_ASSIGN, @$); $$->name = $1; $$->name_span = @1; $$->value = $3; }
;

/* block: "{" { stmt sep } [stmt] "}" */
block:
  "{" stmts "}"         { $$ = $2; $$->open = @1; $$->close = @3; }
| "{" stmts stmt "}"    { $$ = $2; ast_block_push(ps->arena, $$, $3); $$->open = @1; $$->close = @4; }
| "{" stmts error "}"   { $$ = $2; $$->open = @1; $$->close = @4; yyerrok; }
;

stmts:
  %empty                { $$ = block(ps); }
| stmts sep             { $$ = $1; }
| stmts stmt sep        { $$ = $1; ast_block_push(ps->arena, $$, $2); }
| stmts error sep       { $$ = $1; yyerrok; }
;

/* stmt: NAME "=" expr */
stmt:
  NAME "=" expr         { $$ = stmt(ps, ST_ASSIGN, @$); $$->name = $1; $$->name_span = @1; $$->value = $3; }
/* stmt: "repeat" count block */
| REPEAT count block    { $$ = stmt(ps, ST_REPEAT, @$); $$->name_span = @1; $$->value = $2; $$->body = $3; }
/* stmt: expr  -- the result of an experts block */
| expr                  { $$ = stmt(ps, ST_EXPR, @$); $$->value = $1; }
;

/* count: INT | NAME | "(" expr ")" */
count:
  INT                   { $$ = ast_expr_new(ps->arena, EX_INT, @1); $$->i = $1.i; $$->bad = $1.bad; done(ps, $$); }
| NAME                  { $$ = ast_expr_new(ps->arena, EX_NAME, @1); $$->s = $1; done(ps, $$); }
| "(" expr ")"          { $$ = $2; }
;

/* expr: expr ("+" | "-" | "*" | "/" | "%") expr | "-" expr | primary */
expr:
  expr "+" expr         { $$ = binop(ps, '+', $1, $3, @$); }
| expr "-" expr         { $$ = binop(ps, '-', $1, $3, @$); }
| expr "*" expr         { $$ = binop(ps, '*', $1, $3, @$); }
| expr "/" expr         { $$ = binop(ps, '/', $1, $3, @$); }
| expr "%" expr         { $$ = binop(ps, '%', $1, $3, @$); }
| "-" expr %prec NEG    { $$ = ast_expr_new(ps->arena, EX_NEG, @$); $$->a = $2; done(ps, $$); }
| primary               { $$ = $1; }
;

primary:
/* primary: INT | FLOAT | STRING | "true" | "false" | NAME */
  INT                   { $$ = ast_expr_new(ps->arena, EX_INT, @1); $$->i = $1.i; $$->bad = $1.bad; done(ps, $$); }
| FLOAT                 { $$ = ast_expr_new(ps->arena, EX_FLOAT, @1); $$->f = $1.f; $$->bad = $1.bad; done(ps, $$); }
| STRING                { $$ = ast_expr_new(ps->arena, EX_STR, @1); $$->s = $1; done(ps, $$); }
| TRUE                  { $$ = ast_expr_new(ps->arena, EX_BOOL, @1); $$->i = 1; done(ps, $$); }
| FALSE                 { $$ = ast_expr_new(ps->arena, EX_BOOL, @1); $$->i = 0; done(ps, $$); }
| NAME                  { $$ = ast_expr_new(ps->arena, EX_NAME, @1); $$->s = $1; done(ps, $$); }
/* primary: NAME "(" arglist ")" [block] */
| NAME "(" arglist ")"  { $$ = $3; $$->kind = EX_CALL; $$->s = $1; $$->name_span = @1; $$->span = @$; done(ps, $$); }
| NAME "(" arglist ")" block
                        { $$ = $3; $$->kind = EX_CALL; $$->s = $1; $$->name_span = @1; $$->block = $5;
                          $$->span = @$; $$->span.end_line = @4.end_line; $$->span.end_col = @4.end_col; done(ps, $$); }
/* primary: NAME "[" arglist "]"  -- a parameter type, f32[hidden, ffn] */
| NAME "[" arglist "]"  { $$ = $3; $$->kind = EX_TYPE; $$->s = $1; $$->name_span = @1; $$->span = @$; done(ps, $$); }
/* primary: "(" expr ")" */
| "(" expr ")"          { $$ = $2; }
/* primary: "(" expr "," arglist ")"  -- a tuple */
| "(" expr "," arglist ")"
                        { $$ = holder(ps, @$);
                          ast_arg_push(ps->arena, $$, NULL, @2, $2);
                          for (int i = 0; i < $4->n_args; i++)
                            ast_arg_push(ps->arena, $$, $4->args[i].name, $4->args[i].name_span, $4->args[i].value);
                          done(ps, $$); }
/* primary: "{" rfields "}"  -- a record, { ep = 2, dp = 1 } */
| "{" rfields "}"       { $$ = $2; $$->kind = EX_RECORD; $$->span = @$; done(ps, $$); }
;

/* arglist: [ arg { "," arg } [","] ] */
arglist:
  %empty                { $$ = holder(ps, @$); }
| args                  { $$ = $1; }
| args ","              { $$ = $1; }
;

args:
  arg                   { $$ = holder(ps, @$); ast_arg_push(ps->arena, $$, $1.name, $1.name_span, $1.value); }
| args "," arg          { $$ = $1; ast_arg_push(ps->arena, $$, $3.name, $3.name_span, $3.value); }
;

/* arg: [ NAME "=" ] expr */
arg:
  expr                  { $$ = (ast_arg){NULL, @1, $1}; }
| NAME "=" expr         { $$ = (ast_arg){$1, @1, $3}; }
;

/* rfields: [ field { rsep field } [rsep] ] */
rfields:
  %empty                { $$ = holder(ps, @$); }
| rlist                 { $$ = $1; }
| rlist rsep            { $$ = $1; }
;

rlist:
  field                 { $$ = holder(ps, @$); ast_arg_push(ps->arena, $$, $1.name, $1.name_span, $1.value); }
| rlist rsep field      { $$ = $1; ast_arg_push(ps->arena, $$, $3.name, $3.name_span, $3.value); }
;

rsep: "," | NEWLINE | ";" ;

/* field: NAME "=" expr */
field:
  NAME "=" expr         { $$ = (ast_arg){$1, @1, $3}; }
;

%%

static const char *close_of(char c) { return c == '(' ? ")" : c == '[' ? "]" : "}"; }

/* How an expected token reads: "name", "number", "end of line", "'}'". */
static void token_text(yysymbol_kind_t k, char *buf, size_t n) {
  switch (k) {
  case YYSYMBOL_YYEOF: snprintf(buf, n, "end of input"); return;
  case YYSYMBOL_NEWLINE: snprintf(buf, n, "end of line"); return;
  case YYSYMBOL_NAME: snprintf(buf, n, "name"); return;
  case YYSYMBOL_INT: case YYSYMBOL_FLOAT: snprintf(buf, n, "number"); return;
  case YYSYMBOL_STRING: snprintf(buf, n, "string"); return;
  default: snprintf(buf, n, "'%s'", yysymbol_name(k)); return;
  }
}

/* How the unexpected token reads: as above, with the text of names and numbers. */
static void describe(parse_state *ps, yysymbol_kind_t k, const diag_span *at, char *buf, size_t n) {
  if (k == YYSYMBOL_YYEOF) {
    snprintf(buf, n, "%s", ps->file->plain ? "end of the value" : "end of file");
    return;
  }
  if (k != YYSYMBOL_NAME && k != YYSYMBOL_INT && k != YYSYMBOL_FLOAT) {
    token_text(k, buf, n);
    return;
  }
  const diag_file *f = ps->file;
  const char *p = f->text, *end = f->text + f->len;
  for (int l = 1; l < at->line && p < end; l++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    p = nl ? nl + 1 : end;
  }
  const char *start = p + (at->col - 1);
  size_t len = 0;
  if (start < end && at->end_line == at->line && at->end_col > at->col) len = (size_t)(at->end_col - at->col);
  if (start >= end) len = 0;
  else if (len > (size_t)(end - start)) len = (size_t)(end - start);
  const char *what = k == YYSYMBOL_NAME ? "name" : "number";
  if (len > 32) snprintf(buf, n, "%s '%.32s...'", what, start);
  else snprintf(buf, n, "%s '%.*s'", what, (int)len, start);
}

static int is_expr_start(yysymbol_kind_t k) {
  return k == YYSYMBOL_INT || k == YYSYMBOL_FLOAT || k == YYSYMBOL_STRING || k == YYSYMBOL_TRUE ||
         k == YYSYMBOL_FALSE || k == YYSYMBOL_NAME || k == YYSYMBOL_LP || k == YYSYMBOL_MINUS || k == YYSYMBOL_LC;
}

static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t scanner, parse_state *ps) {
  (void)scanner;
  if (ps->fatal || ps->diag->stopped) return 0;
  yysymbol_kind_t look = yypcontext_token(ctx);
  const diag_span *at = yypcontext_location(ctx);
  yysymbol_kind_t exp[YYNTOKENS];
  int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
  if (n < 0) n = 0;
  /* A bracket left open: its closer would fit here, and the file ends, another closer
   * comes, or (for ( and [) the text goes on on a later line. */
  if (ps->snap.ch) {
    char want = close_of(ps->snap.ch)[0];
    yysymbol_kind_t wk = want == ')' ? YYSYMBOL_RP : want == ']' ? YYSYMBOL_RB : YYSYMBOL_RC;
    int fits = 0;
    for (int i = 0; i < n; i++)
      if (exp[i] == wk) fits = 1;
    /* a closer that closed an outer bracket, skipping this one */
    int other_closer = (look == YYSYMBOL_RP || look == YYSYMBOL_RB || look == YYSYMBOL_RC) && look != wk &&
                       ps->depth < ps->snap_depth;
    int later_line = ps->snap.ch != '{' && at->line > ps->snap.line && at->line > ps->prev_line &&
                     look != YYSYMBOL_NEWLINE && look != YYSYMBOL_YYEOF;
    int comma = 0;
    for (int i = 0; i < n; i++)
      if (exp[i] == YYSYMBOL_COMMA) comma = 1;
    if (fits && (look == YYSYMBOL_YYEOF || other_closer || later_line)) {
      if (ps->file->plain)
        parse_error(ps, *at, "expected '%c' (to close '%c')", want, ps->snap.ch);
      else
        parse_error(ps, *at, "expected %s'%c' (to close '%c' at line %d)", comma && later_line ? "',' or " : "", want,
                    ps->snap.ch, ps->snap.line);
      /* Take the bracket as closed, so that the lines after it read as statements again. */
      if (later_line && ps->depth > 0 && ps->open[ps->depth - 1].ch == ps->snap.ch &&
          ps->open[ps->depth - 1].line == ps->snap.line)
        ps->depth--;
      return 0;
    }
  }
  char got[96];
  describe(ps, look, at, got, sizeof got);
  /* The expected list, with the starts of an expression folded into "expression". */
  char names[YYNTOKENS][48];
  int m = 0, has_expr = 0;
  for (int i = 0; i < n; i++)
    if (exp[i] == YYSYMBOL_INT) has_expr = 1;
  for (int i = 0; i < n; i++) {
    char nm[48];
    if (has_expr && is_expr_start(exp[i])) snprintf(nm, sizeof nm, "expression");
    else token_text(exp[i], nm, sizeof nm);
    int dup = 0;
    for (int j = 0; j < m; j++)
      if (strcmp(names[j], nm) == 0) dup = 1;
    if (!dup) memcpy(names[m++], nm, sizeof nm);
  }
  char list[256] = "";
  if (m >= 1 && m <= 4) {
    size_t k = 0;
    for (int i = 0; i < m && k < sizeof list; i++)
      k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i == 0 ? "; expected " : i == m - 1 ? " or " : ", ", names[i]);
  }
  parse_error(ps, *at, "unexpected %s%s", got, list);
  return 0;
}

static void moe_yyerror(diag_span *loc, yyscan_t scanner, parse_state *ps, const char *msg) {
  (void)scanner;
  if (ps->fatal || ps->diag->stopped) return;
  if (strstr(msg, "exhausted")) {
    parse_error(ps, *loc, "expression nested too deeply (the parser stack is full)");
    ps->fatal = 1;
  } else {
    parse_error(ps, *loc, "%s", msg);
  }
}

int parse_source(diag_engine *d, diag_file *f, ast_arena *arena, int as_expr, ast_block **items,
                 ast_expr **expr) {
  parse_state ps;
  memset(&ps, 0, sizeof ps);
  ps.diag = d;
  ps.file = f;
  ps.arena = arena;
  ps.start_tok = as_expr ? TK_START_EXPR : TK_START_FILE;
  ps.line = ps.col = 1;
  yyscan_t scanner;
  if (moe_yylex_init_extra(&ps, &scanner) != 0) {
    diag_error_at(d, f->path, "cannot start the lexer");
    return 1;
  }
  YY_BUFFER_STATE buf = moe_yy_scan_bytes(f->text, (int)f->len, scanner);
  int rc = moe_yyparse(scanner, &ps);
  moe_yy_delete_buffer(buf, scanner);
  moe_yylex_destroy(scanner);
  if (rc != 0 && ps.errors == 0 && !d->stopped) parse_error(&ps, (diag_span){f, 0, 0, 0, 0}, "cannot parse this file");
  if (items) *items = rc == 0 ? ps.items : NULL;
  if (expr) *expr = rc == 0 ? ps.expr : NULL;
  return ps.errors + (rc != 0 && ps.errors == 0);
}
