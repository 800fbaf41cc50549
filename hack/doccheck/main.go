// Command doccheck fails when an exported identifier of a non-test, non-generated Go file
// has no doc comment: types, their exported fields, functions, methods of exported types,
// and constants or variables (a documented group covers its members).
//
//	go run ./hack/doccheck DIR...
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	roots := os.Args[1:]
	if len(roots) == 0 {
		roots = []string{"."}
	}
	var problems []string
	fset := token.NewFileSet()
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if name := d.Name(); name == "testdata" || name == ".git" || name == "bin" || strings.HasPrefix(name, ".") && p != root {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.HasPrefix(d.Name(), "zz_generated") {
				return nil
			}
			f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			if f.Name.Name == "main" {
				return nil // commands document themselves in their package comment
			}
			problems = append(problems, check(fset, f)...)
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "doccheck:", err)
			os.Exit(2)
		}
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "doccheck: %d exported identifiers without a doc comment\n", len(problems))
		os.Exit(1)
	}
}

func check(fset *token.FileSet, f *ast.File) []string {
	var out []string
	miss := func(pos token.Pos, what string) {
		out = append(out, fmt.Sprintf("%s: %s has no doc comment", fset.Position(pos), what))
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv != nil {
				recv := recvType(d.Recv.List[0].Type)
				if !ast.IsExported(recv) || isInterfaceImpl(d.Name.Name) {
					continue
				}
				miss(d.Pos(), "method "+recv+"."+d.Name.Name)
				continue
			}
			miss(d.Pos(), "func "+d.Name.Name)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && s.Doc == nil && d.Doc == nil {
						miss(s.Pos(), "type "+s.Name.Name)
					}
					if st, ok := s.Type.(*ast.StructType); ok && s.Name.IsExported() {
						// A comment may document several adjacent fields by naming them.
						var lastDoc string
						for _, fld := range st.Fields.List {
							if fld.Doc != nil {
								lastDoc = fld.Doc.Text()
							}
							for _, n := range fld.Names {
								if n.IsExported() && fld.Doc == nil && fld.Comment == nil && !strings.Contains(lastDoc, n.Name) {
									miss(n.Pos(), "field "+s.Name.Name+"."+n.Name)
								}
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() && s.Doc == nil && d.Doc == nil && s.Comment == nil {
							miss(n.Pos(), "identifier "+n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// isInterfaceImpl names methods whose meaning is set by a well-known interface.
func isInterfaceImpl(name string) bool {
	switch name {
	case "Error", "Unwrap", "String", "DeepCopy", "DeepCopyInto", "DeepCopyObject":
		return true
	}
	return false
}

func recvType(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvType(t.X)
	case *ast.IndexExpr:
		return recvType(t.X)
	case *ast.Ident:
		return t.Name
	}
	return ""
}
