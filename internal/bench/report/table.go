package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Table is a text table with aligned columns, built row by row and printed
// with WriteTo. The zero Table has no header; NewTable sets one.
//
// Layout: each column is as wide as its widest cell (header included, width
// counted in runes), and columns are separated by two spaces. A column whose
// non-empty body cells are all numbers (Go integer or floating-point values)
// is right-aligned, header included; any other column is left-aligned. Empty
// strings and the missing cells of a short row print as blanks and do not
// count against right alignment. Trailing spaces are trimmed from every line,
// and a line of dashes under the header spans each column.
type Table struct {
	// Prec is the number of digits after the decimal point for float32 and
	// float64 cells. NewTable sets it to 2.
	Prec int

	header []string
	rows   [][]cell
}

type cell struct {
	text    string
	numeric bool
}

// NewTable returns an empty table with the given column headers and Prec 2.
func NewTable(header ...string) *Table {
	return &Table{Prec: 2, header: header}
}

// Row appends a row. Cells are formatted when added: strings as they are,
// floats with Prec digits after the point (NaN and infinities as Go prints
// them), integers in decimal, anything else with fmt.Sprint.
func (t *Table) Row(cells ...any) {
	r := make([]cell, len(cells))
	for i, c := range cells {
		r[i] = t.format(c)
	}
	t.rows = append(t.rows, r)
}

func (t *Table) format(v any) cell {
	switch x := v.(type) {
	case string:
		return cell{text: x}
	case float64:
		return cell{strconv.FormatFloat(x, 'f', t.Prec, 64), true}
	case float32:
		return cell{strconv.FormatFloat(float64(x), 'f', t.Prec, 32), true}
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, uintptr:
		return cell{fmt.Sprint(x), true}
	default:
		return cell{text: fmt.Sprint(x)}
	}
}

// WriteTo prints the table to w; see Table for the layout. It implements
// io.WriterTo.
func (t *Table) WriteTo(w io.Writer) (int64, error) {
	ncol := len(t.header)
	for _, r := range t.rows {
		ncol = max(ncol, len(r))
	}
	width := make([]int, ncol)
	right := make([]bool, ncol)
	for c := range ncol {
		if c < len(t.header) {
			width[c] = runeLen(t.header[c])
		}
		numbers, texts := 0, 0
		for _, r := range t.rows {
			if c >= len(r) || r[c].text == "" {
				continue
			}
			width[c] = max(width[c], runeLen(r[c].text))
			if r[c].numeric {
				numbers++
			} else {
				texts++
			}
		}
		right[c] = numbers > 0 && texts == 0
	}
	var b strings.Builder
	line := func(cells []string) {
		var l strings.Builder
		for c := range ncol {
			s := ""
			if c < len(cells) {
				s = cells[c]
			}
			if c > 0 {
				l.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[c]-runeLen(s))
			if right[c] {
				l.WriteString(pad + s)
			} else {
				l.WriteString(s + pad)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " "))
		b.WriteByte('\n')
	}
	if len(t.header) > 0 {
		line(t.header)
		dashes := make([]string, ncol)
		for c := range dashes {
			dashes[c] = strings.Repeat("-", width[c])
		}
		line(dashes)
	}
	for _, r := range t.rows {
		texts := make([]string, len(r))
		for i, c := range r {
			texts[i] = c.text
		}
		line(texts)
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

func runeLen(s string) int { return len([]rune(s)) }
